"""The CPU dense matvec kernel against a float64 product, and its place among
`dense_linear`'s tactics."""

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.kernels import dense_linear as dense_linear_module
from mlxcel_core.kernels.cpu_matvec import dense
from mlxcel_core.kernels.cpu_matvec.dense import cpu_dense_matvec
from mlxcel_core.kernels.dense_linear import dense_linear

# `on_the_cpu` is an autouse fixture.
from cpu_kernels import needs_kernel, on_the_cpu  # noqa: F401


def operands(rows: int, outputs: int, inputs: int, seed: int = 0) -> tuple[mx.array, mx.array]:
    generator = np.random.default_rng(seed)
    x = generator.standard_normal((rows, inputs), dtype=np.float32)
    weight = generator.standard_normal((outputs, inputs), dtype=np.float32)
    return mx.array(x), mx.array(weight)


def exact(x: mx.array, weight: mx.array) -> np.ndarray:
    return np.array(x).astype(np.float64) @ np.array(weight).astype(np.float64).T


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 16, 32])
@pytest.mark.parametrize("outputs", [1, 3, 4, 5, 66])
@pytest.mark.parametrize("inputs", [1, 7, 8, 9, 64, 577])
def test_the_kernel_computes_the_product(rows, outputs, inputs):
    x, weight = operands(rows, outputs, inputs, seed=rows * outputs + inputs)
    got = cpu_dense_matvec(x, weight)
    assert got.shape == (rows, outputs) and got.dtype == mx.float32
    # float32 sums of `inputs` products of unit normals: error grows like sqrt(inputs).
    np.testing.assert_allclose(np.array(got), exact(x, weight), rtol=1e-5, atol=1e-5 * inputs**0.5)


@needs_kernel
@pytest.mark.parametrize("rows", [2, 5, 16])
@pytest.mark.parametrize("outputs", [1, 7, 9, 130])
def test_two_threads_compute_what_one_computes(rows, outputs):
    x, weight = operands(rows, outputs, 200, seed=outputs)
    one = cpu_dense_matvec(x, weight)
    two = cpu_dense_matvec(x, weight, threads=2)
    assert mx.array_equal(one, two)


@needs_kernel
def test_a_rows_result_does_not_depend_on_the_other_rows():
    x, weight = operands(16, 37, 301)
    together = cpu_dense_matvec(x, weight)
    for first in (0, 3, 14):
        alone = cpu_dense_matvec(x[first : first + 2], weight)
        assert mx.array_equal(alone, together[first : first + 2])


@needs_kernel
def test_leading_axes_sliced_and_lazy_inputs():
    x, weight = operands(12, 20, 48)
    batched = (x * 2).reshape(3, 4, 48)
    got = cpu_dense_matvec(batched, weight)
    assert got.shape == (3, 4, 20)
    np.testing.assert_allclose(
        np.array(got).reshape(12, 20), exact(x * 2, weight), rtol=1e-5, atol=1e-4
    )
    transposed = mx.array(np.array(weight).T.copy()).T  # a strided view of the weight
    np.testing.assert_allclose(
        np.array(cpu_dense_matvec(x[:, ::1][2:6], transposed)),
        exact(x[2:6], weight),
        rtol=1e-5,
        atol=1e-4,
    )


@needs_kernel
def test_non_finite_values_propagate():
    x, weight = operands(2, 4, 16)
    x = mx.concatenate([mx.full((1, 16), np.inf), x[1:]])
    got = np.array(cpu_dense_matvec(x, mx.abs(weight)))
    assert np.isinf(got[0]).all() and np.isfinite(got[1]).all()


@pytest.mark.parametrize(
    ("x", "weight", "message"),
    [
        (mx.zeros((33, 8)), mx.zeros((4, 8)), "1 to 32 rows"),
        (mx.zeros((4, 8), dtype=mx.bfloat16), mx.zeros((4, 8)), "bfloat16"),
        (mx.zeros((4, 8)), mx.zeros((4, 8), dtype=mx.float16), "float16"),
        (mx.zeros((4, 8)), mx.zeros((4, 9)), "takes 9"),
    ],
)
def test_products_it_does_not_take_are_refused(x, weight, message):
    with pytest.raises(ValueError, match=message):
        cpu_dense_matvec(x, weight)


@needs_kernel
def test_threads_other_than_one_and_two_are_refused():
    x, weight = operands(2, 4, 8)
    with pytest.raises(ValueError, match="threads must be 1 or 2, got 3"):
        cpu_dense_matvec(x, weight, threads=3)


def test_threads_split_large_products_only():
    assert dense.threads_for(16, 1536, 576, cpu_streams=2) == 2
    assert dense.threads_for(2, 192, 576, cpu_streams=2) == 1
    assert dense.threads_for(16, 1536, 576, cpu_streams=1) == 1


@needs_kernel
def test_dense_linear_takes_the_kernel_at_decode_rows_only(monkeypatch):
    calls = []
    kernel = dense_linear_module.dense.cpu_dense_matvec

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(dense_linear_module.dense, "cpu_dense_matvec", counted)
    weight = operands(2, 24, 40)[1]
    for rows in (1, 2, 32, 33):
        x = operands(rows, 24, 40, seed=rows)[0]
        got = dense_linear(x, weight, cpu_streams=2)
        np.testing.assert_allclose(np.array(got), exact(x, weight), rtol=1e-5, atol=1e-4)
    assert calls == [(2, 40), (32, 40)]
    dense_linear(operands(4, 24, 40)[0].astype(mx.bfloat16), weight.astype(mx.bfloat16))
    assert len(calls) == 2
