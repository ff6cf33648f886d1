"""The SwiGLU activation `silu(gate) * up` in float32 on the CPU, by a C kernel with an
eight-lane exp (swiglu.c; docs/adr/0037-cpu-swiglu-kernel.md).

MLX builds its fused CPU kernels without `-march`, so the compiled `silu(gate) * up` of
mlx-lm's MLPs computes exp one lane at a time and calls libm for every fused multiply-add;
in a dense float32 model on the CPU that activation took 17-21% of prefill and about 13% of
decode. Like `cpu_quantized_matvec`, the kernel runs outside MLX's graph: the inputs are
evaluated, the result is computed into a NumPy buffer through ctypes (the GIL released),
and it becomes a new MLX array. So it serves forward passes, not functions under
`mx.compile` or gradients.
"""

from __future__ import annotations

import ctypes

import mlx.core as mx
import numpy as np

from mlxcel_core.kernels.cpu_matvec.native import (
    c_buffer,
    describe_kernel,
    entry_point,
)

# The C arguments of `mlxcel_swiglu`.
_ARGUMENTS = (ctypes.c_void_p,) * 3 + (ctypes.c_size_t, ctypes.c_int)

# Activations of at least this many elements are split over two threads.
SPLIT_MIN_ELEMENTS = 64 * 2**10


def supports(gate: mx.array, up: mx.array) -> bool:
    """Whether the kernel takes this activation: float32 `gate` and `up` of one shape, with
    the CPU as the default device."""
    return (
        gate.dtype == mx.float32
        and up.dtype == mx.float32
        and gate.shape == up.shape
        and mx.default_device().type == mx.DeviceType.cpu
    )


def threads_for(elements: int, cpu_streams: int) -> int:
    """Threads for an activation of `elements` values, where the caller may use
    `cpu_streams` cores: 2 from `SPLIT_MIN_ELEMENTS` on, else 1."""
    return 2 if elements >= SPLIT_MIN_ELEMENTS and cpu_streams >= 2 else 1


def describe_cpu_swiglu() -> str:
    """One line saying whether the SwiGLU activation on the CPU runs on the C kernel, or on
    MLX and why."""
    return describe_kernel("MLX's swiglu")


def cpu_swiglu(gate: mx.array, up: mx.array, *, threads: int = 1) -> mx.array:
    """`silu(gate) * up`, element by element, by the C kernel.

    Evaluates `gate` and `up` (lazy, sliced or transposed inputs are read in row-major
    order). Within 3.5e-7 relative of the exact value where silu(gate) is a normal float
    (MLX's float32 `sigmoid(gate) * gate * up`: 1.6e-6 for gates of a few units, 0 below
    about -88); a gate under -103.97, where silu underflows, gives 0; NaN stays NaN.

    Args:
        gate: (...) float32 gate projection.
        up: float32 up projection, the shape of `gate`.
        threads: 1, or 2 to compute the second half on another thread.

    Returns:
        float32, the shape of `gate`, a new array.

    Raises:
        ValueError: inputs `supports` refuses, `threads` other than 1 and 2, or the
            library is not available (see `native.NativeLibrary.reason`).
    """
    if not supports(gate, up):
        raise ValueError(
            "the CPU SwiGLU kernel takes float32 gate and up of one shape on the CPU; got "
            f"gate {gate.dtype} {gate.shape}, up {up.dtype} {up.shape} on "
            f"{mx.default_device()}"
        )
    if threads not in (1, 2):
        raise ValueError(f"threads must be 1 or 2, got {threads}")
    mx.eval(gate, up)
    out = np.empty(gate.shape, dtype=np.float32)
    (gate_pointer, _gate_held), (up_pointer, _up_held) = c_buffer(gate), c_buffer(up)
    entry_point("mlxcel_swiglu", *_ARGUMENTS)(
        gate_pointer, up_pointer, out.ctypes.data, out.size, threads
    )
    return mx.array(out)


__all__ = ["SPLIT_MIN_ELEMENTS", "cpu_swiglu", "describe_cpu_swiglu", "supports", "threads_for"]
