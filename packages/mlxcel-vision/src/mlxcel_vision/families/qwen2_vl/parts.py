"""Loading a Qwen2-VL or Qwen2.5-VL folder into the family's parts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.nn as nn

from mlxcel_models.compute import ComputeOptions
from mlxcel_models.errors import ModelLoadError
from mlxcel_vision.families.qwen2_vl.config import parse_config
from mlxcel_vision.families.qwen2_vl.processor import Qwen2VLImageProcessor
from mlxcel_vision.families.qwen2_vl.text import MultimodalRoPE, Qwen2VLTextDecoder
from mlxcel_vision.families.qwen2_vl.vision import VisionTower
from mlxcel_vision.families.qwen2_vl.weights import map_weights
from mlxcel_vision.family import VisionParts
from mlxcel_vision.text_decoder import make_text_model
from mlxcel_vision.weights import load_module_weights, read_safetensors


class Qwen2VLModel(nn.Module):
    """Every weight of the model: `visual` (vision tower and merger) and `language_model`
    (mlx-lm's qwen2 model)."""

    def __init__(self, visual: VisionTower, language_model: nn.Module) -> None:
        super().__init__()
        self.visual = visual
        self.language_model = language_model


def _read_preprocessor_config(folder: Path) -> dict[str, Any]:
    path = folder / "preprocessor_config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from error


def load_parts(folder: Path, config: dict[str, Any], compute: ComputeOptions) -> VisionParts:
    """The processor, vision tower and language model of a Qwen2-VL / Qwen2.5-VL folder.

    Args:
        folder: a Hugging Face or mlx-vlm folder (quantized ones too): config.json,
            model*.safetensors, preprocessor_config.json.
        config: its config.json.
        compute: dtype and quantization choices applied to the weights (not evaluated).

    Raises:
        ModelLoadError: the config is not a Qwen2-VL one, a file is missing or unreadable,
            or a tensor is missing, unexpected or of the wrong shape.
    """
    settings = parse_config(config)
    visual = VisionTower(settings.vision)
    language_model = make_text_model(settings.text)
    module = Qwen2VLModel(visual, language_model)
    tied = bool(language_model.args.tie_word_embeddings)
    weights = map_weights(read_safetensors(folder), settings.vision, tied_embeddings=tied)
    load_module_weights(module, weights, folder, compute)
    head_dim = settings.text["hidden_size"] // settings.text["num_attention_heads"]
    rope = MultimodalRoPE(head_dim, settings.rope_theta, settings.mrope_section)
    return VisionParts(
        processor=Qwen2VLImageProcessor(_read_preprocessor_config(folder), settings.image_token_id),
        encoder=visual,
        decoder=Qwen2VLTextDecoder(language_model, rope, settings.vision.merge_size),
        module=module,
    )
