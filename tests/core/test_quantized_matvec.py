"""The quantized matrix-vector kernels against an exact (float64) product of the dequantized
weight, which reads MLX's layout as `mx.quantized_matmul` does: their CUDA and Metal
sources run on CPU threads (cuda_emulation.py, metal_emulation.py), the dispatch, the
argument checks, and on a CUDA GPU the kernel itself.

Tolerances, relative to the largest |output|: the kernels accumulate in float32 and round
once to the output dtype, so float32 outputs agree within 1e-5; float16 within 2e-3 and
bfloat16 within 1e-2 (a few units of the output's last place).
"""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np
import pytest
from cuda_emulation import COMPILER, CudaEmulator
from kernel_caches import kernels_built_by
from metal_emulation import MetalEmulator

from mlxcel_core.kernels import CUDA, METAL, cpu_matvec, quantized_linear
from mlxcel_core.kernels.quantized_matvec import (
    quantized_matvec_backend,
    quantized_matvec_kernel,
    supports,
)
from mlxcel_core.kernels.quantized_matvec.kernel import threads_for

quantized_matvec_cuda = functools.partial(quantized_matvec_kernel, backend=CUDA)
quantized_matvec_metal = functools.partial(quantized_matvec_kernel, backend=METAL)

TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1e-2}
ON_CUDA = mx.cuda.is_available()
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="needs g++ to run kernels on the CPU")


def make_product(rows, out_features, in_features, *, bits, group_size, dtype, seed=0):
    """x (rows, K) and a quantized W (N, K) of `dtype` scales, with W's exact float64
    dequantized values."""
    keys = mx.random.split(mx.random.key(seed))
    w = mx.random.normal((out_features, in_features), key=keys[0]).astype(dtype)
    x = mx.random.normal((rows, in_features), key=keys[1]).astype(dtype)
    weight, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    packed = np.array(weight)
    per_word = 32 // bits
    levels = np.stack(
        [(packed >> (bits * j)) & ((1 << bits) - 1) for j in range(per_word)], axis=-1
    ).reshape(out_features, in_features)
    expand = lambda a: np.repeat(np.array(a.astype(mx.float32), np.float64), group_size, 1)  # noqa: E731
    dense = levels * expand(scales) + expand(biases)
    return x, weight, scales, biases, dense


def exact(x: mx.array, dense: np.ndarray) -> np.ndarray:
    return np.array(x.astype(mx.float32), np.float64) @ dense.T


def assert_close(out: mx.array, expected: np.ndarray, dtype: mx.Dtype) -> None:
    assert out.dtype == dtype
    got = np.array(out.astype(mx.float32), np.float64)
    assert np.isfinite(got).all()
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE[dtype] * scale)


@pytest.fixture
def emulated_cuda(monkeypatch, tmp_path):
    """The CUDA kernel compiled for and run on CPU threads while a test runs."""
    with kernels_built_by(monkeypatch, CUDA, CudaEmulator(tmp_path).cuda_kernel):
        yield


@pytest.fixture
def emulated_metal(monkeypatch, tmp_path):
    """The Metal kernel compiled for and run on CPU threads while a test runs."""
    with kernels_built_by(monkeypatch, METAL, MetalEmulator(tmp_path).metal_kernel):
        yield


# (rows, N, K, bits, group_size, dtype): N is not a multiple of the block's outputs; K of
# 1,280 at 4 bits is 40 chunks, more than one warp and fewer than two.
CPU_CASES = [
    (1, 37, 1280, 4, 64, mx.bfloat16),
    (3, 21, 256, 4, 32, mx.float32),
    (8, 10, 512, 4, 128, mx.float16),
    (2, 9, 256, 8, 64, mx.bfloat16),
    (5, 11, 128, 8, 32, mx.float32),
]


@needs_compiler
@pytest.mark.parametrize(("rows", "n", "k", "bits", "group_size", "dtype"), CPU_CASES)
def test_cuda_source_on_cpu_threads_matches_the_exact_product(
    emulated_cuda, rows, n, k, bits, group_size, dtype
):
    x, weight, scales, biases, dense = make_product(
        rows, n, k, bits=bits, group_size=group_size, dtype=dtype, seed=rows
    )
    with mx.stream(mx.cpu):
        out = quantized_matvec_cuda(x, weight, scales, biases, group_size=group_size, bits=bits)
    assert out.shape == (rows, n)
    assert_close(out, exact(x, dense), dtype)


@pytest.mark.parametrize(("bits", "group_size"), [(4, 32), (4, 64), (4, 128), (8, 64)])
def test_the_exact_product_reads_mlx_affine_layout_as_quantized_matmul_does(bits, group_size):
    # MLX's CPU quantized_matmul rounds its 16-bit sums, so it is held to float32 here.
    x, weight, scales, biases, dense = make_product(
        3, 24, 256, bits=bits, group_size=group_size, dtype=mx.float32
    )
    with mx.stream(mx.cpu):
        reference = mx.quantized_matmul(
            x, weight, scales, biases, transpose=True, group_size=group_size, bits=bits
        )
    assert_close(reference, exact(x, dense), mx.float32)


@needs_compiler
def test_cuda_source_takes_leading_axes_and_other_block_sizes(emulated_cuda):
    x, weight, scales, biases, dense = make_product(
        6, 13, 256, bits=4, group_size=64, dtype=mx.float32, seed=9
    )
    with mx.stream(mx.cpu):
        for rows_per_block in (1, 3, 8):
            out = quantized_matvec_cuda(
                x.reshape(2, 3, 256), weight, scales, biases, group_size=64, bits=4,
                rows_per_block=rows_per_block,
            )  # fmt: skip
            assert out.shape == (2, 3, 13)
            assert_close(out.reshape(6, 13), exact(x, dense), mx.float32)


@needs_compiler
@pytest.mark.parametrize(("rows", "n", "k", "bits", "group_size", "dtype"), CPU_CASES[:2])
def test_metal_source_on_cpu_threads_matches_the_exact_product(
    emulated_metal, rows, n, k, bits, group_size, dtype
):
    x, weight, scales, biases, dense = make_product(
        rows, n, k, bits=bits, group_size=group_size, dtype=dtype, seed=rows
    )
    with mx.stream(mx.cpu):
        out = quantized_matvec_metal(x, weight, scales, biases, group_size=group_size, bits=bits)
    assert_close(out, exact(x, dense), dtype)


def test_kernel_takes_decode_rows_of_float_activations_against_4_and_8_bit_groups():
    assert supports(mx.bfloat16, 4, 64, 1)
    assert supports(mx.float16, 8, 32, 8)
    assert supports(mx.float32, 4, 128, 5)
    assert not supports(mx.bfloat16, 4, 64, 9)
    assert not supports(mx.bfloat16, 4, 64, 0)
    assert not supports(mx.bfloat16, 3, 64, 1)
    assert not supports(mx.bfloat16, 4, 16, 1)
    assert not supports(mx.int32, 4, 64, 1)


def test_threads_cover_a_weight_rows_chunks_in_whole_warps():
    assert threads_for(4096, 4) == 128  # 128 chunks
    assert threads_for(2048, 4) == 64
    assert threads_for(1280, 4) == 64  # 40 chunks
    assert threads_for(256, 4) == 32
    assert threads_for(14336, 4) == 128
    assert threads_for(4096, 8) == 128


def test_arguments_are_checked_before_launch():
    x, weight, scales, biases, _ = make_product(2, 8, 128, bits=4, group_size=64, dtype=mx.float32)
    for kernel in (quantized_matvec_cuda, quantized_matvec_metal):
        with pytest.raises(ValueError, match="takes 8 rows or fewer"):
            kernel(mx.zeros((9, 128)), weight, scales, biases, group_size=64, bits=4)
        with pytest.raises(ValueError, match="x has 64 features but weight packs 128"):
            kernel(x[:, :64], weight, scales, biases, group_size=64, bits=4)
        with pytest.raises(ValueError, match=r"scales and biases must be \(8, 2\)"):
            kernel(x, weight, scales[:, :1], biases, group_size=64, bits=4)
        with pytest.raises(ValueError, match="rows_per_block must be >= 1, got 0"):
            kernel(x, weight, scales, biases, group_size=64, bits=4, rows_per_block=0)


def test_the_cpu_takes_no_gpu_kernel_and_without_its_own_keeps_quantized_matmul(monkeypatch):
    assert quantized_matvec_backend(mx.Device(mx.cpu), mx.bfloat16, 4, 64, 1) is None
    monkeypatch.setattr(cpu_matvec, "available", lambda: False)
    x, weight, scales, biases, _ = make_product(2, 8, 128, bits=4, group_size=64, dtype=mx.float32)
    with mx.stream(mx.cpu):
        out = quantized_linear(x, weight, scales, biases, group_size=64, bits=4)
        expected = mx.quantized_matmul(
            x, weight, scales, biases, transpose=True, group_size=64, bits=4
        )
    assert mx.array_equal(out, expected)


# Layers of the Llama 3 shapes (N, K): 8B q/o, k/v, gate/up and down; 1B q/o; and many
# outputs, as an LM head has.
GPU_SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (2048, 2048), (16384, 4096)]


@pytest.mark.skipif(not ON_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize(("n", "k"), GPU_SHAPES)
def test_cuda_kernel_matches_the_exact_product(n, k):
    x, weight, scales, biases, dense = make_product(
        8, n, k, bits=4, group_size=64, dtype=mx.bfloat16, seed=n + k
    )
    for rows in (1, 2, 5, 8):
        assert quantized_matvec_backend(mx.default_device(), mx.bfloat16, 4, 64, rows) is CUDA
        out = quantized_linear(x[:rows], weight, scales, biases, group_size=64, bits=4)
        assert_close(out, exact(x[:rows], dense), mx.bfloat16)


@pytest.mark.skipif(not ON_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize(("rows", "n", "k", "bits", "group_size", "dtype"), CPU_CASES)
def test_cuda_kernel_matches_the_exact_product_in_every_layout(rows, n, k, bits, group_size, dtype):
    x, weight, scales, biases, dense = make_product(
        rows, n, k, bits=bits, group_size=group_size, dtype=dtype, seed=rows
    )
    for rows_per_block in (1, 4, 8):
        out = quantized_matvec_cuda(
            x, weight, scales, biases, group_size=group_size, bits=bits,
            rows_per_block=rows_per_block,
        )  # fmt: skip
        assert_close(out, exact(x, dense), dtype)
