"""mlx-lm's model classes, built from a Hugging Face text config, for every loader."""

from __future__ import annotations

import importlib
from typing import Any

import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import MODEL_REMAPPING


def make_mlx_lm_model(config: dict[str, Any]) -> nn.Module:
    """An mlx-lm `Model` of `config['model_type']` with its random initial weights; types
    mlx-lm runs with another type's module (mistral with llama's) are mapped as it maps them.

    Raises:
        ModuleNotFoundError: mlx-lm has no module for the model type.
        TypeError: the config lacks an argument the model's `ModelArgs` requires.
    """
    model_type = MODEL_REMAPPING.get(config["model_type"], config["model_type"])
    architecture = importlib.import_module(f"mlx_lm.models.{model_type}")
    return architecture.Model(architecture.ModelArgs.from_dict(config))


def count_parameters(module: nn.Module) -> int:
    """Parameters of `module`: a quantized layer counts the values its weight packs, not its
    scales and biases (as mlx-lm's `get_total_parameters`, which misses the parameters a
    module holds beside its children, such as CLIP's class embedding)."""
    total = sum(array.size for _, array in tree_flatten(module.parameters()))
    for _, layer in module.named_modules():
        if isinstance(layer, nn.QuantizedLinear | nn.QuantizedEmbedding):
            packed = layer["weight"].size
            total += packed * 32 // layer.bits - packed
            total -= sum(layer[name].size for name in ("scales", "biases") if name in layer)
    return total
