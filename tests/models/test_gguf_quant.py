"""Each ggml tensor type, loaded as mlxcel holds it, against gguf-py's own dequantization.

Bounds: the types kept as affine codes differ from gguf-py's values only by rounding their
scale and bias to float16 (at most 2^-10 of the group's largest value); the requantized
types by at most one step of the MLX grid over each group's range, (max - min) / (2^bits - 1),
plus that rounding (MLX places its grid so that zero is exact, which moves the ends by up to
half a step, so the half step of a free grid is not a bound).
"""

import gguf
import mlx.core as mx
import numpy as np
import pytest

from mlxcel_models.loading.gguf_affine import pack_codes
from mlxcel_models.loading.gguf_quant import (
    LOADABLE_TYPES,
    GGUFDequant,
    convert_tensor,
    plan_tensor,
)

from gguf_blocks import ALL_TYPES, CRAFTED, dequantized, tensor_data

SHAPE = (16, 512)
Q = gguf.GGMLQuantizationType


def mlx_values(arrays: dict[str, mx.array], form) -> np.ndarray:
    """The float32 values MLX computes from a converted tensor (scales kept as stored)."""
    if not form.is_quantized:
        return np.array(arrays["weight"].astype(mx.float32))
    scales = arrays["scales"]
    biases = arrays.get("biases")
    if form.mode == "affine":
        scales, biases = scales.astype(mx.float32), biases.astype(mx.float32)
    values = mx.dequantize(
        arrays["weight"],
        scales,
        biases,
        group_size=form.group_size,
        bits=form.bits,
        mode=form.mode,
    )
    return np.array(values.astype(mx.float32))


def load(type_name: str, dequant: GGUFDequant = GGUFDequant.AUTO):
    data = tensor_data(type_name, SHAPE)
    form = plan_tensor(type_name, SHAPE, quantizable=True, dequant=dequant)
    return (
        form,
        mlx_values(convert_tensor(data, type_name, form), form),
        dequantized(data, type_name),
    )


def by_group(values: np.ndarray, group_size: int) -> np.ndarray:
    return values.reshape(SHAPE[0], -1, group_size)


def test_every_type_gguf_py_dequantizes_is_covered():
    assert set(ALL_TYPES) == LOADABLE_TYPES - {"F32"}


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_each_type_loads_within_its_bound_of_gguf_py_values(type_name):
    form, ours, reference = load(type_name)
    assert ours.shape == reference.shape == SHAPE
    assert np.isfinite(reference).all()
    if not form.is_quantized:
        np.testing.assert_array_equal(ours, reference)
        return
    group = form.group_size
    largest = np.abs(by_group(reference, group)).max(-1, keepdims=True)
    error = np.abs(by_group(ours - reference, group))
    if form.exact:
        assert (error <= 2**-10 * largest).all()
        return
    spread = np.ptp(by_group(reference, group), -1, keepdims=True)
    step = spread / (2**form.bits - 1)
    assert (error <= step + 2**-9 * largest).all()
    # The bound is not vacuous: the requantized grid moves values.
    assert error.max() > 0


@pytest.mark.parametrize(
    ("type_name", "label", "exact"),
    [
        ("Q8_0", "8-bit g32", True),
        ("Q4_0", "4-bit g32", True),
        ("Q5_1", "5-bit g32", True),
        ("Q4_K", "4-bit g32", True),
        ("Q5_K", "5-bit g32", True),
        ("TQ2_0", "2-bit g128", True),
        ("MXFP4", "mxfp4", True),
        ("Q6_K", "6-bit g64", False),
        ("Q3_K", "3-bit g64", False),
        ("Q2_K", "2-bit g64", False),
        ("IQ4_XS", "4-bit g128", False),
        ("IQ4_NL", "4-bit g64", False),
        ("IQ2_XXS", "2-bit g128", False),
        ("IQ1_S", "2-bit g128", False),
    ],
)
def test_each_type_takes_its_nearest_mlx_form(type_name, label, exact):
    form = plan_tensor(type_name, SHAPE, quantizable=True, dequant=GGUFDequant.AUTO)
    assert (form.label, form.exact) == (label, exact)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q5_0", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4"])
def test_types_mlx_holds_exactly_load_without_any_change(type_name):
    _, ours, reference = load(type_name)
    np.testing.assert_array_equal(ours, reference)


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_bf16_holds_gguf_py_values_rounded_to_bfloat16(type_name):
    form, ours, reference = load(type_name, GGUFDequant.BF16)
    if type_name == "F16":
        assert form.dtype == mx.float16
    else:
        assert form.dtype == mx.bfloat16
        expected = np.array(mx.array(reference).astype(mx.bfloat16).astype(mx.float32))
        np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize(
    ("type_name", "shape", "quantizable"),
    [
        ("Q4_K", SHAPE, False),
        ("IQ3_S", SHAPE, False),
        # Three 32-value IQ4_NL blocks: not a whole 64-value group.
        ("IQ4_NL", (4, 96), True),
    ],
)
def test_a_matrix_mlx_cannot_quantize_stays_dense(type_name, shape, quantizable):
    form = plan_tensor(type_name, shape, quantizable=quantizable, dequant=GGUFDequant.AUTO)
    assert form.dtype == mx.float16


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_codes_are_packed_as_mlx_packs_them(bits):
    weights = mx.random.normal((8, 256), key=mx.random.key(bits))
    packed, scales, biases = mx.quantize(weights, group_size=32, bits=bits)
    values = mx.dequantize(packed, scales, biases, group_size=32, bits=bits)
    codes = mx.round((values - mx.repeat(biases, 32, -1)) / mx.repeat(scales, 32, -1))
    np.testing.assert_array_equal(
        pack_codes(np.array(codes).astype(np.uint8), bits), np.array(packed)
    )


def test_large_tensors_are_converted_in_row_chunks(monkeypatch):
    monkeypatch.setattr("mlxcel_models.loading.gguf_quant._ROWS_ELEMENTS", 512 * 3)
    for type_name in ("Q4_K", "IQ2_XS"):
        data = tensor_data(type_name, SHAPE)
        form = plan_tensor(type_name, SHAPE, quantizable=True, dequant=GGUFDequant.AUTO)
        chunked = mlx_values(convert_tensor(data, type_name, form), form)
        monkeypatch.undo()
        whole = mlx_values(convert_tensor(data, type_name, form), form)
        monkeypatch.setattr("mlxcel_models.loading.gguf_quant._ROWS_ELEMENTS", 512 * 3)
        np.testing.assert_array_equal(chunked, whole)


def test_crafted_types_are_the_ones_gguf_py_cannot_quantize():
    for type_name in CRAFTED:
        with pytest.raises(NotImplementedError):
            gguf.quants.quantize(
                np.zeros((1, 256), np.float32), gguf.GGMLQuantizationType[type_name]
            )
