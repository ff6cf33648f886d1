"""benchmarks/export_mlx_lm.py: a GGUF model written as an mlx-lm folder loads back equal."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import load_model as mlx_lm_load_model
from mlx_lm.utils import load_tokenizer

from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loading.loader import load_model

from benchmark_scripts import load_benchmark

export_mlx_lm = load_benchmark("export_mlx_lm")


def test_export_loads_in_mlx_lm_with_equal_logits(tiny_gguf: Path, tmp_path: Path) -> None:
    folder = export_mlx_lm.export_gguf(tiny_gguf, tmp_path / "tiny-mlx")
    reference = load_model(tiny_gguf, compute=ComputeOptions())
    module, config = mlx_lm_load_model(folder)
    tokens = mx.array([[1, 5, 17, 42, 99, 3]])

    assert config["quantization"]["bits"] == 8
    assert mx.array_equal(module(tokens), reference.model.module(tokens))


def test_export_keeps_chat_template_and_eos(tiny_gguf: Path, tmp_path: Path) -> None:
    folder = export_mlx_lm.export_gguf(tiny_gguf, tmp_path / "tiny-mlx")
    reference = load_model(tiny_gguf, compute=ComputeOptions())
    tokenizer = load_tokenizer(folder)
    messages = [{"role": "user", "content": "Hello"}]

    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True) == (
        reference.tokenizer.hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_dict=False
        )
    )
    saved = json.loads((folder / "config.json").read_text())
    assert set(saved["eos_token_id"]) == set(reference.tokenizer.eos_token_ids)


def test_quantization_config_keys_layers_that_differ_from_the_default() -> None:
    module = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64))
    nn.quantize(module, class_predicate=lambda path, _: {"group_size": 32, "bits": 4})
    module.layers[2] = nn.QuantizedLinear(64, 64, group_size=32, bits=8)

    assert export_mlx_lm.quantization_config(module) == {
        "group_size": 32,
        "bits": 4,
        "mode": "affine",
        "layers.2": {"group_size": 32, "bits": 8, "mode": "affine"},
    }


def test_quantization_config_is_none_for_a_float_model() -> None:
    assert export_mlx_lm.quantization_config(nn.Linear(8, 8)) is None


def test_float32_export_writes_dense_float32_weights_with_equal_logits(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    folder = export_mlx_lm.export_gguf(tiny_gguf, tmp_path / "tiny-f32", float32=True)
    module, config = mlx_lm_load_model(folder)
    dense = ComputeOptions(float_dtype=mx.float32, dense_weights_max_bytes=2**62)
    reference = load_model(tiny_gguf, compute=dense)
    tokens = mx.array([[1, 5, 17, 42, 99, 3]])

    assert "quantization" not in config
    assert {value.dtype for _, value in nn.utils.tree_flatten(module.parameters())} == {mx.float32}
    assert mx.array_equal(module(tokens), reference.model.module(tokens))
