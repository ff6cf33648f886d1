import os
from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxcel_core.kernels import KernelOptions, install_kernel_options, options, stream_split
from mlxcel_models.compute import (
    CUDA_DEQUANTIZE_MIN_ROWS,
    ComputeOptions,
    PrefillDequantizingLinear,
    cpu_product_streams,
)
from mlxcel_models.cpu_layers import CpuLinear, CpuQuantizedEmbedding
from mlxcel_models.loading.loader import load_model

TOKENS = mx.array([[5, 80, 81, 200, 17, 42, 9, 260] * 5])


def test_cpu_defaults_are_float32_with_dense_weights_up_to_a_quarter_of_memory():
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    options = ComputeOptions.for_device(mx.Device(mx.cpu))
    assert options == ComputeOptions(
        float_dtype=mx.float32,
        dequantize_min_rows=4,
        dense_weights_max_bytes=memory // 4,
        cpu_ops=True,
        cpu_streams=cpu_product_streams(),
    )
    assert cpu_product_streams() == min(os.cpu_count(), 2)
    on_gpu = (
        ComputeOptions(dequantize_min_rows=CUDA_DEQUANTIZE_MIN_ROWS)
        if mx.cuda.is_available()
        else ComputeOptions()
    )
    assert ComputeOptions.for_device(mx.Device(mx.gpu)) == on_gpu


def test_an_apple_gpu_with_the_metal_kernels_on_routes_quantized_layers_through_them(
    tiny_gguf, monkeypatch
):
    monkeypatch.setattr(mx.cuda, "is_available", lambda: False)
    monkeypatch.setattr(options, "_cuda_available", lambda: False)
    monkeypatch.setattr(options, "_metal_available", lambda: True)
    gpu = mx.Device(mx.gpu)
    try:
        assert ComputeOptions.for_device(gpu) == ComputeOptions()
        install_kernel_options(KernelOptions(metal_kernels=True))
        assert ComputeOptions.for_device(gpu) == ComputeOptions(kernel_linear=True)
    finally:
        install_kernel_options(KernelOptions())
    loaded = load_model(tiny_gguf, compute=ComputeOptions(kernel_linear=True))
    layers = [m for _, m in loaded.model.module.named_modules()]
    routed = [m for m in layers if isinstance(m, PrefillDequantizingLinear)]
    assert len(routed) == 14 and all(m.dequantize_min_rows is None for m in routed)


def test_dense_weights_replace_every_quantized_layer_within_the_limit(tiny_gguf):
    plain = load_model(tiny_gguf, compute=ComputeOptions())
    dense = load_model(tiny_gguf, compute=ComputeOptions(mx.float32, dense_weights_max_bytes=2**30))
    layers = [m for _, m in dense.model.module.named_modules()]
    assert not any(isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding) for m in layers)
    params = dict(tree_flatten(dense.model.module.parameters()))
    assert params["model.layers.0.self_attn.q_proj.weight"].dtype == mx.float32
    expected = plain.model(TOKENS, plain.model.make_cache())
    actual = dense.model(TOKENS, dense.model.make_cache())
    np.testing.assert_allclose(
        np.array(actual), np.array(expected.astype(mx.float32)), atol=2e-2, rtol=2e-2
    )


def test_a_model_over_the_dense_limit_keeps_quantized_layers_with_the_prefill_tactic(tiny_gguf):
    options = ComputeOptions(mx.float32, dequantize_min_rows=4, dense_weights_max_bytes=1024)
    layers = [m for _, m in load_model(tiny_gguf, compute=options).model.module.named_modules()]
    assert sum(isinstance(m, PrefillDequantizingLinear) for m in layers) == 14


def test_options_change_dtypes_and_layers_but_not_the_logits(tiny_gguf):
    plain = load_model(tiny_gguf, compute=ComputeOptions())
    tuned = load_model(tiny_gguf, compute=ComputeOptions(mx.float32, dequantize_min_rows=8))
    plain_params = dict(tree_flatten(plain.model.module.parameters()))
    tuned_params = dict(tree_flatten(tuned.model.module.parameters()))
    assert plain_params.keys() == tuned_params.keys()
    assert plain_params["model.layers.0.self_attn.q_proj.scales"].dtype == mx.float16
    assert tuned_params["model.layers.0.self_attn.q_proj.scales"].dtype == mx.float32
    assert tuned_params["model.layers.0.self_attn.q_proj.weight"].dtype == mx.uint32
    layers = [m for _, m in tuned.model.module.named_modules()]
    assert sum(isinstance(m, PrefillDequantizingLinear) for m in layers) == 14
    assert not any(type(m) is nn.QuantizedLinear for m in layers)
    for last_only in (False, True):
        expected = plain.model(TOKENS, plain.model.make_cache(), last_only=last_only)
        actual = tuned.model(TOKENS, tuned.model.make_cache(), last_only=last_only)
        assert actual.dtype == mx.float32
        np.testing.assert_allclose(
            np.array(actual), np.array(expected.astype(mx.float32)), atol=2e-2, rtol=2e-2
        )


def test_dequantize_min_rows_must_be_positive():
    with pytest.raises(ValueError, match="dequantize_min_rows must be >= 1, got 0"):
        ComputeOptions(dequantize_min_rows=0)


@pytest.mark.parametrize("dense", [False, True])
def test_products_split_over_cpu_streams_give_the_same_logits(tiny_gguf, monkeypatch, dense):
    # The tiny model's layers are narrower than the columns from which products split.
    monkeypatch.setattr(stream_split, "MIN_SPLIT_COLUMNS", 1)
    whole = ComputeOptions(
        mx.float32, dequantize_min_rows=8, dense_weights_max_bytes=2**30 if dense else None
    )
    reference = load_model(tiny_gguf, compute=whole).model
    split = load_model(tiny_gguf, compute=replace(whole, cpu_streams=2))
    layers = [m for _, m in split.model.module.named_modules()]
    kind = CpuLinear if dense else PrefillDequantizingLinear
    assert sum(isinstance(m, kind) and m.cpu_streams == 2 for m in layers) == 14
    assert dense or sum(isinstance(m, CpuQuantizedEmbedding) for m in layers) == 1
    for tokens in (TOKENS[:, :8], TOKENS[:, :1]):  # decode rows: 8 take the dense tactic
        expected = reference(tokens, reference.make_cache())
        actual = split.model(tokens, split.model.make_cache())
        np.testing.assert_allclose(np.array(actual), np.array(expected), atol=1e-4, rtol=1e-4)
