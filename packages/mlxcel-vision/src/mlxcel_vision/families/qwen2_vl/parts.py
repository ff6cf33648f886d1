"""Loading a Qwen2-VL or Qwen2.5-VL folder into the family's parts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcel_models.architectures import make_text_model
from mlxcel_models.compute import ComputeOptions, apply_compute_options
from mlxcel_models.errors import ModelLoadError
from mlxcel_vision.families.qwen2_vl.config import parse_config
from mlxcel_vision.families.qwen2_vl.processor import Qwen2VLImageProcessor
from mlxcel_vision.families.qwen2_vl.text import MultimodalRoPE, Qwen2VLTextDecoder
from mlxcel_vision.families.qwen2_vl.vision import VisionTower
from mlxcel_vision.families.qwen2_vl.weights import map_weights, module_name
from mlxcel_vision.family import VisionParts

# How many missing or unexpected tensor names an error message lists.
NAMES_SHOWN = 5


class Qwen2VLModel(nn.Module):
    """Every weight of the model: `visual` (vision tower and merger) and `language_model`
    (mlx-lm's qwen2 model)."""

    def __init__(self, visual: VisionTower, language_model: nn.Module) -> None:
        super().__init__()
        self.visual = visual
        self.language_model = language_model


def _read_safetensors(folder: Path) -> dict[str, mx.array]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no .safetensors files")
    weights: dict[str, mx.array] = {}
    for file in files:
        weights.update(mx.load(str(file)))
    return weights


def _read_preprocessor_config(folder: Path) -> dict[str, Any]:
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder}: no preprocessor_config.json")
    return json.loads(path.read_text(encoding="utf-8"))


def _quantize_as_stored(
    module: nn.Module, quantization: dict[str, Any], weights: dict[str, mx.array]
) -> None:
    """Make quantized the layers stored quantized (those with `scales`), with the file's
    group size, bits and mode and its per-layer overrides, as mlx-lm and mlx-vlm write them."""
    overrides = {
        module_name(path): setting
        for path, setting in quantization.items()
        if isinstance(setting, (dict, bool))
    }

    def stored_quantized(path: str, layer: nn.Module) -> bool | dict:
        if path in overrides:
            return overrides[path]
        return f"{path}.scales" in weights

    nn.quantize(
        module,
        group_size=quantization["group_size"],
        bits=quantization["bits"],
        mode=quantization.get("mode", "affine"),
        class_predicate=stored_quantized,
    )


def _check_names(module: nn.Module, weights: dict[str, mx.array], folder: Path) -> None:
    expected = {name for name, _ in tree_flatten(module.parameters())}
    missing = sorted(expected - weights.keys())
    unexpected = sorted(weights.keys() - expected)
    if missing:
        raise ModelLoadError(f"{folder}: missing tensors {', '.join(missing[:NAMES_SHOWN])}")
    if unexpected:
        raise ModelLoadError(f"{folder}: unexpected tensors {', '.join(unexpected[:NAMES_SHOWN])}")


def load_parts(folder: Path, config: dict[str, Any], compute: ComputeOptions) -> VisionParts:
    """The processor, vision tower and language model of a Qwen2-VL / Qwen2.5-VL folder.

    Args:
        folder: a Hugging Face or mlx-vlm folder (quantized ones too): config.json,
            *.safetensors, preprocessor_config.json.
        config: its config.json.
        compute: dtype and quantization choices applied to the weights (not evaluated).

    Raises:
        ModelLoadError: the config is not a Qwen2-VL one, a file is missing, or a tensor
            is missing, unexpected or of the wrong shape.
    """
    settings = parse_config(config)
    visual = VisionTower(settings.vision)
    language_model = make_text_model(settings.text)
    module = Qwen2VLModel(visual, language_model)
    tied = bool(language_model.args.tie_word_embeddings)
    weights = map_weights(_read_safetensors(folder), settings.vision, tied_embeddings=tied)
    if "quantization" in config:
        _quantize_as_stored(module, config["quantization"], weights)
    _check_names(module, weights, folder)
    try:
        module.load_weights(list(weights.items()), strict=True)
    # A tensor of the wrong shape surfaces as MLX's ValueError naming it.
    except ValueError as error:
        raise ModelLoadError(f"{folder}: {error}") from error
    apply_compute_options(module, compute)
    head_dim = settings.text["hidden_size"] // settings.text["num_attention_heads"]
    rope = MultimodalRoPE(head_dim, settings.rope_theta, settings.mrope_section)
    return VisionParts(
        processor=Qwen2VLImageProcessor(_read_preprocessor_config(folder), settings.image_token_id),
        encoder=visual,
        decoder=Qwen2VLTextDecoder(language_model, rope, settings.vision.merge_size),
        module=module,
    )
