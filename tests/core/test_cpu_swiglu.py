"""The CPU SwiGLU kernel against `silu(gate) * up` computed in float64, at odd sizes,
extreme values, on one and two threads, and the inputs it refuses."""

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.kernels.cpu_matvec import swiglu

# `on_the_cpu` is an autouse fixture.
from cpu_kernels import needs_kernel, on_the_cpu  # noqa: F401

# float32 rounds each of the exp, the sum, the division and two products. (MLX's float32
# `sigmoid(g) * g * u` is within 1.6e-6 of float64 for gates of a few units, less close for
# larger ones, and gives 0 where exp(-g) overflows.)
MAX_RELATIVE_ERROR = 3.5e-7
SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)


def exact(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float64)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g)) * up.astype(np.float64)


def assert_close_to_exact(got: mx.array, gate: mx.array, up: mx.array) -> None:
    expected = exact(np.array(gate), np.array(up))
    got = np.array(got).astype(np.float64)
    normal = np.abs(expected) >= SMALLEST_NORMAL
    relative = np.abs(got - expected)[normal] / np.abs(expected)[normal]
    assert relative.max(initial=0.0) <= MAX_RELATIVE_ERROR
    assert np.abs(got - expected)[~normal].max(initial=0.0) < 1e-42


@needs_kernel
@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (13,), (3, 5, 37), (16, 1, 1536), (2, 4099)])
@pytest.mark.parametrize("scale", [1.0, 6.0, 40.0])
def test_the_kernel_computes_silu_of_gate_times_up(shape, scale):
    gate = mx.random.normal(shape, key=mx.random.key(len(shape))) * scale
    up = mx.random.normal(shape, key=mx.random.key(7))
    got = swiglu.cpu_swiglu(gate, up)
    assert got.shape == gate.shape and got.dtype == mx.float32
    assert_close_to_exact(got, gate, up)
    in_mlx_range = np.abs(np.array(gate)) < 80
    reference = np.array(mx.sigmoid(gate) * gate * up)[in_mlx_range]
    np.testing.assert_allclose(np.array(got)[in_mlx_range], reference, rtol=1e-5, atol=1e-30)


@needs_kernel
def test_extreme_gates_give_zero_or_the_gate_never_nan_or_inf():
    gates = [100.0, -100.0, 0.0, -0.0, 1e-40, -1e-40, 88.5, -88.5, -103.0, -200.0, 1e30, -1e30]
    gate = mx.array(gates, dtype=mx.float32)
    up = mx.full(gate.shape, 2.0)
    got = np.array(swiglu.cpu_swiglu(gate, up))
    assert np.isfinite(got).all()
    assert_close_to_exact(mx.array(got), gate, up)
    assert got[0] == 200.0 and got[10] == 2e30
    assert got[-1] == 0.0 and got[-3] == 0.0
    assert got[4] == pytest.approx(1e-40, rel=1e-3)  # a denormal gate: silu(g) = g / 2


@needs_kernel
def test_infinite_and_nan_gates():
    gate = mx.array([np.inf, -np.inf, np.nan], dtype=mx.float32)
    got = np.array(swiglu.cpu_swiglu(gate, mx.ones(3)))
    assert got[0] == np.inf and got[1] == 0.0 and np.isnan(got[2])


@needs_kernel
@pytest.mark.parametrize("size", [8, 9, swiglu.SPLIT_MIN_ELEMENTS + 13])
def test_two_threads_compute_what_one_computes(size):
    gate = mx.random.normal((size,), key=mx.random.key(size)) * 8
    up = mx.random.normal((size,), key=mx.random.key(1))
    one = swiglu.cpu_swiglu(gate, up, threads=1)
    assert mx.array_equal(one, swiglu.cpu_swiglu(gate, up, threads=2))
    with pytest.raises(ValueError, match="threads must be 1 or 2, got 3"):
        swiglu.cpu_swiglu(gate, up, threads=3)


@needs_kernel
def test_lazy_sliced_and_transposed_inputs_are_read_in_order():
    wide = mx.random.normal((4, 96), key=mx.random.key(3))
    gate = wide[:, 5:42] * 3.0  # lazy until the kernel evaluates it
    up = mx.random.normal((37, 4), key=mx.random.key(4)).T
    got = swiglu.cpu_swiglu(gate, up)
    assert got.shape == (4, 37)
    assert_close_to_exact(got, gate, up)


@needs_kernel
def test_empty_inputs():
    got = swiglu.cpu_swiglu(mx.zeros((0, 8)), mx.zeros((0, 8)))
    assert got.shape == (0, 8)


@pytest.mark.parametrize(
    ("gate", "up"),
    [
        (mx.zeros((4,), dtype=mx.float16), mx.zeros((4,), dtype=mx.float16)),
        (mx.zeros((4,), dtype=mx.bfloat16), mx.zeros((4,))),
        (mx.zeros((4,)), mx.zeros((4,), dtype=mx.float16)),
        (mx.zeros((4,)), mx.zeros((2, 2))),
    ],
)
def test_inputs_the_kernel_does_not_take_are_refused(gate, up):
    assert not swiglu.supports(gate, up)
    with pytest.raises(ValueError, match="CPU SwiGLU kernel takes float32 gate and up of one"):
        swiglu.cpu_swiglu(gate, up)


def test_only_large_activations_split_and_only_with_a_second_core():
    assert swiglu.threads_for(swiglu.SPLIT_MIN_ELEMENTS, cpu_streams=2) == 2
    assert swiglu.threads_for(swiglu.SPLIT_MIN_ELEMENTS - 1, cpu_streams=2) == 1
    assert swiglu.threads_for(10 * swiglu.SPLIT_MIN_ELEMENTS, cpu_streams=1) == 1


@needs_kernel
def test_the_description_names_the_kernel():
    assert swiglu.describe_cpu_swiglu().startswith("mlxcel's AVX2 kernel (built with ")
