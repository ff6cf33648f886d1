"""KV cache codecs: round-trip error bounds per type, bit packing, the Lloyd-Max codebooks
and TurboQuant's rotation, on random data."""

from __future__ import annotations

import math
from itertools import pairwise

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.cache.quant import (
    CACHE_TYPES,
    CacheTypeError,
    bytes_per_vector,
    kv_bytes_per_vector,
    make_kv_codec,
)
from mlxcel_core.cache.quant.bitpack import pack_bits, packed_width, unpack_bits
from mlxcel_core.cache.quant.lloyd_max import gaussian_codebook
from mlxcel_core.cache.quant.rotation import hadamard_rotation

HEAD_DIM = 64
QUANTIZED = ("q8_0", "q4_0", "turbo2", "turbo3", "turbo4")


def random_vectors(seed: int = 0, shape=(200, 3, HEAD_DIM), scale: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def round_trip(cache_type: str, x: np.ndarray, dtype=mx.float32) -> np.ndarray:
    codec = make_kv_codec(cache_type, x.shape[-1])
    return np.array(codec.decode(codec.encode(mx.array(x)), dtype).astype(mx.float32))


def relative_mse(x: np.ndarray, y: np.ndarray) -> float:
    """Mean over head-vectors of ||x - y||^2 / ||x||^2."""
    return float(np.mean(np.sum((x - y) ** 2, -1) / np.sum(x * x, -1)))


# Float types


def test_f32_round_trip_is_exact():
    x = random_vectors()
    np.testing.assert_array_equal(round_trip("f32", x), x)


@pytest.mark.parametrize(("cache_type", "dtype"), [("f16", mx.float16), ("bf16", mx.bfloat16)])
def test_f16_and_bf16_round_trips_equal_a_cast(cache_type, dtype):
    x = random_vectors()
    expected = np.array(mx.array(x).astype(dtype).astype(mx.float32))
    np.testing.assert_array_equal(round_trip(cache_type, x), expected)


# llama.cpp's block formats, against a numpy port of ggml-quants.c's reference code


def reference_q8_0(x: np.ndarray) -> np.ndarray:
    groups = x.reshape(*x.shape[:-1], -1, 32)
    d = np.abs(groups).max(-1, keepdims=True) / 127
    inverse = np.where(d != 0, 1 / np.where(d != 0, d, 1), 0)
    q = np.round(groups * inverse)
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


def reference_q4_0(x: np.ndarray) -> np.ndarray:
    groups = x.reshape(*x.shape[:-1], -1, 32)
    largest = np.take_along_axis(groups, np.abs(groups).argmax(-1)[..., None], -1)
    d = largest / -8
    inverse = np.where(d != 0, 1 / np.where(d != 0, d, 1), 0)
    q = np.minimum(np.floor(groups * inverse + 8.5), 15)
    return ((q - 8) * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


@pytest.mark.parametrize(
    ("cache_type", "reference", "steps"),
    [("q8_0", reference_q8_0, 127), ("q4_0", reference_q4_0, 8)],
)
def test_block_formats_match_llama_cpp_and_stay_within_one_step(cache_type, reference, steps):
    x = random_vectors(seed=1)
    decoded = round_trip(cache_type, x)
    np.testing.assert_allclose(decoded, reference(x), rtol=1e-6, atol=1e-6)
    groups = x.reshape(-1, 32)
    step = np.abs(groups).max(-1, keepdims=True) / steps
    error = np.abs(decoded.reshape(-1, 32) - groups)
    # q8_0 rounds to the nearest step; q4_0's one-sided range can clip one step; both
    # carry a float16 scale (relative error <= 2^-11 on up to 8 or 127 steps).
    bound = 0.5 if cache_type == "q8_0" else 1.0
    assert np.all(error <= step * (bound + steps * 2**-11) + 1e-6)


def test_q4_0_keeps_each_groups_largest_value_exactly_up_to_the_float16_scale():
    x = random_vectors(seed=2).reshape(-1, 32)
    decoded = round_trip("q4_0", x.reshape(-1, 1, HEAD_DIM)).reshape(-1, 32)
    index = np.abs(x).argmax(-1)
    rows = np.arange(len(x))
    np.testing.assert_allclose(decoded[rows, index], x[rows, index], rtol=2**-10)


# Error ordering over all types


def test_round_trip_errors_shrink_with_more_bits():
    x = random_vectors(seed=3)
    errors = {t: relative_mse(x, round_trip(t, x)) for t in CACHE_TYPES if t != "auto"}
    assert errors["f32"] == 0
    assert errors["f16"] < errors["bf16"] < errors["q8_0"] < errors["q4_0"]
    assert errors["q8_0"] < errors["turbo4"] < errors["turbo3"] < errors["turbo2"]
    assert errors["q8_0"] < 1e-4


def rest_energy_share(x: np.ndarray) -> np.ndarray:
    """||r||^2 / ||x||^2 per head-vector, r being x without its largest-magnitude feature
    (the one outlier TurboQuant keeps apart at D = 64)."""
    energy = x * x
    return 1 - energy.max(-1) / energy.sum(-1)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_turbo_error_is_the_codebooks_mse_on_the_rest_whatever_the_vectors_scale_or_skew(bits):
    """TurboQuant's distortion bound does not depend on the input distribution: after the
    rotation, the relative MSE of what is left once the outlier is set aside is the Gaussian
    codebook's, for isotropic and skewed data."""
    mse = gaussian_codebook(bits).mse
    isotropic = random_vectors(seed=4, scale=100.0)
    skewed = random_vectors(seed=5) * np.geomspace(0.01, 10, HEAD_DIM, dtype=np.float32) + 5.0
    for x in (isotropic, skewed):
        expected = mse * float(np.mean(rest_energy_share(x)))
        assert 0.85 * expected < relative_mse(x, round_trip(f"turbo{bits}", x)) < 1.15 * expected


@pytest.mark.parametrize("bits", [3, 4])
def test_turbo_keeps_a_dominant_feature_and_its_error_follows_the_rest(bits):
    """Keys like SmolLM2's, where one feature carries most of the norm: that feature comes
    back to float16 precision, and the error is the codebook's share of the rest only, a
    tenth of what quantizing the whole vector would cost here."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((300, 2, HEAD_DIM)).astype(np.float32)
    spikes = rng.integers(0, HEAD_DIM, (300, 2))
    np.put_along_axis(x, spikes[..., None], 25.0 * rng.choice([-1, 1], (300, 2, 1)), -1)
    decoded = round_trip(f"turbo{bits}", x)
    np.testing.assert_allclose(
        np.take_along_axis(decoded, spikes[..., None], -1),
        np.take_along_axis(x, spikes[..., None], -1),
        rtol=2**-11,
    )
    share = float(np.mean(rest_energy_share(x)))
    assert share < 0.1
    assert relative_mse(x, decoded) < 1.15 * gaussian_codebook(bits).mse * share


def test_turbo_stores_outlier_positions_beyond_255_for_wide_heads():
    codec = make_kv_codec("turbo4", 512)
    assert [c.dtype for c in codec.components[2:]] == [mx.uint16, mx.float16]
    assert codec.components[2].width == 512 // 64
    x = random_vectors(seed=7, shape=(5, 1, 512))
    x[:, :, 300] = 40.0
    decoded = round_trip("turbo4", x)
    np.testing.assert_allclose(decoded[:, :, 300], 40.0)


@pytest.mark.parametrize("cache_type", QUANTIZED)
def test_zero_vectors_round_trip_to_zero(cache_type):
    zeros = np.zeros((4, 2, HEAD_DIM), np.float32)
    np.testing.assert_array_equal(round_trip(cache_type, zeros), zeros)


@pytest.mark.parametrize("cache_type", [t for t in CACHE_TYPES if t != "auto"])
def test_encode_gives_the_declared_components_and_decode_takes_leading_axes(cache_type):
    codec = make_kv_codec(cache_type, HEAD_DIM)
    x = mx.array(random_vectors(shape=(6, 3, HEAD_DIM)))
    parts = codec.encode(x)
    assert [(p.shape, p.dtype) for p in parts] == [
        ((6, 3, c.width), c.dtype) for c in codec.components
    ]
    batched = codec.decode([p.reshape(2, 3, 3, -1) for p in parts], mx.float16)
    assert batched.shape == (2, 3, 3, HEAD_DIM) and batched.dtype == mx.float16
    flat = codec.decode(parts, mx.float16)
    assert mx.array_equal(batched.reshape(6, 3, HEAD_DIM), flat)


# Sizes and head-dim checks


def test_bytes_per_head_vector():
    sizes = {t: kv_bytes_per_vector(t, HEAD_DIM, mx.float16) for t in CACHE_TYPES}
    assert sizes == {
        "auto": 128,
        "f32": 256,
        "f16": 128,
        "bf16": 128,
        "q8_0": 68,
        "q4_0": 36,
        "turbo2": 21,
        "turbo3": 29,
        "turbo4": 37,
    }
    assert sizes["turbo4"] <= 0.3 * sizes["f16"]
    assert kv_bytes_per_vector("auto", HEAD_DIM, mx.float32) == 256
    # Codes, the float16 scale, and two outliers (a byte of position, a float16 value).
    codec = make_kv_codec("turbo3", 128)
    assert bytes_per_vector(codec) == 128 * 3 // 8 + 2 + 2 * (1 + 2)
    assert kv_bytes_per_vector("turbo4", 128, mx.float16) <= 0.3 * 256


@pytest.mark.parametrize(
    ("cache_type", "head_dim", "needs"),
    [("turbo3", 96, "power of two"), ("turbo4", 4, "power of two"), ("q8_0", 48, "multiple of 32"),
     ("q4_0", 16, "multiple of 32")],
)  # fmt: skip
def test_a_head_dim_the_type_cannot_store_is_refused_by_name(cache_type, head_dim, needs):
    with pytest.raises(CacheTypeError, match=f"{cache_type} needs .*{needs}.*head_dim={head_dim}"):
        make_kv_codec(cache_type, head_dim)


def test_unknown_cache_type_lists_the_accepted_names():
    with pytest.raises(ValueError, match="one of auto, f32, f16, bf16, q8_0, q4_0, turbo2"):
        make_kv_codec("q5_1", HEAD_DIM)


# Bit packing


@pytest.mark.parametrize("bits", range(1, 9))
def test_bit_packing_round_trips_and_is_tight(bits):
    rng = np.random.default_rng(bits)
    codes = mx.array(rng.integers(0, 2**bits, (5, 3, 40)).astype(np.uint8))
    packed = pack_bits(codes, bits)
    assert packed.shape == (5, 3, 40 * bits // 8) and packed.dtype == mx.uint8
    assert packed_width(bits, 40) == 40 * bits // 8
    assert mx.array_equal(unpack_bits(packed, bits), codes)


def test_bit_packing_rejects_bad_widths():
    with pytest.raises(ValueError, match="multiple of 8, got 12"):
        pack_bits(mx.zeros((12,), mx.uint8), 3)
    with pytest.raises(ValueError, match="bits must be in"):
        pack_bits(mx.zeros((8,), mx.uint8), 9)
    with pytest.raises(ValueError, match="multiple of bits=3, got 4"):
        unpack_bits(mx.zeros((4,), mx.uint8), 3)


# Lloyd-Max codebooks and the rotation


@pytest.mark.parametrize("bits", range(1, 6))
def test_codebooks_are_sorted_symmetric_and_self_consistent(bits):
    codebook = gaussian_codebook(bits)
    levels, boundaries = np.array(codebook.levels), np.array(codebook.boundaries)
    assert len(levels) == 2**bits and len(boundaries) == 2**bits - 1
    assert np.all(np.diff(levels) > 0) and np.all(np.diff(boundaries) > 0)
    np.testing.assert_allclose(levels, -levels[::-1], atol=1e-9)
    np.testing.assert_allclose(boundaries, (levels[1:] + levels[:-1]) / 2)
    # The MSE it reports is the one sampling measures.
    x = np.random.default_rng(bits).standard_normal(400_000)
    quantized = levels[np.searchsorted(boundaries, x)]
    assert np.mean((x - quantized) ** 2) == pytest.approx(codebook.mse, rel=0.02)


def test_codebook_mse_falls_with_bits_and_matches_max_1960():
    mses = [gaussian_codebook(bits).mse for bits in range(1, 6)]
    assert all(a > b for a, b in pairwise(mses))
    # J. Max, "Quantizing for minimum distortion" (1960), Table I.
    assert mses[:4] == pytest.approx([0.3634, 0.1175, 0.03454, 0.009497], rel=1e-3)
    np.testing.assert_allclose(gaussian_codebook(2).levels[2:], [0.4528, 1.510], atol=1e-3)
    np.testing.assert_allclose(gaussian_codebook(1).levels[1], math.sqrt(2 / math.pi))


@pytest.mark.parametrize("head_dim", [8, 64, 128])
def test_rotation_is_orthogonal_and_preserves_norms(head_dim):
    rotation = hadamard_rotation(head_dim).astype(np.float64)
    np.testing.assert_allclose(rotation @ rotation.T, np.eye(head_dim), atol=1e-6)
    x = random_vectors(shape=(50, head_dim)).astype(np.float64)
    np.testing.assert_allclose(
        np.linalg.norm(x @ rotation, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-6
    )
    # Random signs: column 0 of the bare Hadamard matrix is all ones, here it is the signs;
    # and they are fixed from one call to the next.
    assert set(np.sign(rotation[:, 0]).tolist()) == {-1.0, 1.0}
    np.testing.assert_array_equal(hadamard_rotation(head_dim), hadamard_rotation(head_dim))


def test_rotation_refuses_a_head_dim_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="power of two, got 96"):
        hadamard_rotation(96)
