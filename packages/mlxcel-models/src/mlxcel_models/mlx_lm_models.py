"""mlx-lm's model classes, built from a Hugging Face text config, for every loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcel_models.model_args import config_error, family_module, make_model_args


def make_mlx_lm_model(config: dict[str, Any], *, where: str | Path) -> nn.Module:
    """An mlx-lm `Model` of `config['model_type']` with its random initial weights; types
    mlx-lm runs with another type's module (mistral with llama's) are mapped as it maps them.

    Args:
        config: the text config.
        where: the file `config` came from, named in errors.

    Raises:
        ModuleNotFoundError: mlx-lm has no module for the model type.
        ModelLoadError: the config lacks a key the model's `ModelArgs` requires, a value
            has the wrong type or is out of range (`make_model_args`), or the model's
            constructor refuses it (an unknown RoPE type).
    """
    args = make_model_args(config, where=where)
    architecture = family_module(config, where=where)
    try:
        return architecture.Model(args)
    except (TypeError, ValueError) as error:
        raise config_error(error, where) from error


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
