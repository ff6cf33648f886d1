import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.kernels import quantized_linear


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_dense_tactic_matches_quantized_matmul(bits, rows):
    w = mx.random.normal((48, 64), key=mx.random.key(0))
    weight, scales, biases = mx.quantize(w, group_size=32, bits=bits)
    x = mx.random.normal((2, rows, 64), key=mx.random.key(1))
    bias = mx.random.normal((48,), key=mx.random.key(2))
    reference = x @ mx.dequantize(weight, scales, biases, group_size=32, bits=bits).T + bias
    for min_rows in (None, 1, 32):
        y = quantized_linear(
            x, weight, scales, biases, group_size=32, bits=bits, bias=bias,
            dequantize_min_rows=min_rows,
        )  # fmt: skip
        assert y.shape == (2, rows, 48)
        np.testing.assert_allclose(np.array(y), np.array(reference), atol=1e-4, rtol=1e-4)


def test_dense_tactic_keeps_the_activation_dtype():
    weight, scales, biases = mx.quantize(mx.ones((32, 32)), group_size=32, bits=4)
    x = mx.ones((40, 32), dtype=mx.float32)
    y = quantized_linear(x, weight, scales, biases, group_size=32, bits=4, dequantize_min_rows=8)
    assert y.dtype == mx.float32
