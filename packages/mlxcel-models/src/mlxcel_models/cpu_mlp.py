"""mlx-lm's SwiGLU MLPs with their activation computed by mlxcel's CPU kernel.

Many mlx-lm families (llama, qwen2/3, cohere, granite, the dense layers and shared experts
of DeepSeek, ...) compute their MLP as `down_proj(swiglu(gate_proj(x), up_proj(x)))`. On the
CPU, MLX's compiled `swiglu` computes exp one lane at a time (docs/adr/0037); the C kernel
(`mlxcel_core.kernels.cpu_matvec.swiglu`) does the same activation eight lanes at a time,
in one call instead of a compiled graph. The products stay the model's own layers.

An MLP is recognised by what its `__call__` computes (its bytecode and the names it reads
equal to one of mlx-lm's two ways of writing that line, and its `swiglu` being mlx-lm's),
not by a list of classes, so families added to mlx-lm are covered and a body that differs
in any way (another activation, clamping, arguments swapped) is left alone.
"""

from __future__ import annotations

import functools
import inspect
import types

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu

from mlxcel_core.kernels.cpu_matvec import swiglu as swiglu_kernel

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# Activations of fewer values keep mlx-lm's `swiglu`. The kernel makes the forward pass
# wait for the gate and up projections, so the host no longer builds the rest of the step
# while they compute; at few values that costs more than the kernel saves. Measured on a
# 2-core Xeon with SmolLM2 (1,536 values a row): one decode row about 10% slower with the
# kernel (`mlxcel bench -p 32 -n 128`), 16 rows (24,576 values) about 3% faster, prefill
# chunks 10-20% faster (docs/adr/0037-cpu-swiglu-kernel.md).
KERNEL_MIN_ELEMENTS = 16 * 2**10


def _returned(self, x):
    return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


def _named_then_returned(self, x):
    down_proj = self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
    return down_proj


def _body(function: types.FunctionType) -> tuple:
    """What a function computes and takes: its bytecode, the names it reads (in order),
    its parameters; not its variables' names, line numbers or `__future__` flags."""
    code = function.__code__
    extra_arguments = code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    return (code.co_code, code.co_names, code.co_argcount, code.co_kwonlyargcount, extra_arguments)


_SWIGLU_BODIES = frozenset(_body(function) for function in (_returned, _named_then_returned))


class KernelSwiGLU:
    """Mixed into an mlx-lm MLP's own class (`kernel_class`): its `__call__`, with the
    activation by `cpu_swiglu` where `swiglu_kernel.supports` the projections' outputs and
    they hold at least `KERNEL_MIN_ELEMENTS` values, else mlx-lm's `swiglu`.

    Attributes:
        kernel_cpu_streams: cores the activation may use (`swiglu_kernel.threads_for`).
    """

    kernel_cpu_streams: int = 1

    def __call__(self, x: mx.array) -> mx.array:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if gate.size >= KERNEL_MIN_ELEMENTS and swiglu_kernel.supports(gate, up):
            threads = swiglu_kernel.threads_for(gate.size, self.kernel_cpu_streams)
            return self.down_proj(swiglu_kernel.cpu_swiglu(gate, up, threads=threads))
        return self.down_proj(swiglu(gate, up))


def _call_of(cls: type) -> object:
    """The `__call__` instances of `cls` run (inherited or its own), None if none."""
    owners = (vars(klass) for klass in cls.__mro__)
    return next((owner["__call__"] for owner in owners if "__call__" in owner), None)


def is_swiglu_mlp(module: nn.Module) -> bool:
    """Whether `module` computes exactly `down_proj(swiglu(gate_proj(x), up_proj(x)))`
    with mlx-lm's `swiglu` and has those three layers."""
    call = _call_of(type(module))
    return (
        isinstance(call, types.FunctionType)
        and _body(call) in _SWIGLU_BODIES
        and call.__globals__.get("swiglu") is swiglu
        and all(isinstance(module.get(name), nn.Module) for name in PROJECTIONS)
    )


@functools.cache
def kernel_class(cls: type[nn.Module]) -> type[nn.Module]:
    """`cls` with `KernelSwiGLU`'s `__call__`: a subclass, so model code that asks
    `isinstance(layer.mlp, MLP)` (mlx-lm's `shard`) still takes the MLP's branch."""
    return type(f"KernelSwiGLU{cls.__name__}", (KernelSwiGLU, cls), {"__module__": __name__})


def install_kernel_swiglu(mlp: nn.Module, cpu_streams: int) -> None:
    """Make `mlp` (one `is_swiglu_mlp` accepts) compute its activation with the kernel, in
    place: its layers, parameters and other attributes are kept as they are.

    Args:
        mlp: the MLP.
        cpu_streams: cores the activation may use, >= 1.
    """
    mlp.__class__ = kernel_class(type(mlp))
    mlp.kernel_cpu_streams = cpu_streams
