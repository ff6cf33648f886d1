"""mlx-lm's text model classes, for the packages above that build models around them
(a vision-language model's language model is usually one of these)."""

from __future__ import annotations

import importlib
from typing import Any

import mlx.nn as nn

from mlxcel_models.errors import ModelLoadError


def make_text_model(config: dict[str, Any]) -> nn.Module:
    """mlx-lm's `Model` for `config["model_type"]`, its weights freshly initialised.

    The module has mlx-lm's layout: `model.embed_tokens`, `model.layers`, `model.norm` and,
    unless the embeddings are tied, `lm_head`; its body takes `input_embeddings`.

    Raises:
        ModelLoadError: mlx-lm has no such architecture, or `config` lacks a field it needs.
    """
    model_type = config.get("model_type")
    try:
        architecture = importlib.import_module(f"mlx_lm.models.{model_type}")
    except ModuleNotFoundError as error:
        raise ModelLoadError(f"mlx-lm has no text model '{model_type}'") from error
    try:
        return architecture.Model(architecture.ModelArgs.from_dict(config))
    # A missing required field surfaces as the ModelArgs constructor's TypeError.
    except TypeError as error:
        raise ModelLoadError(f"bad {model_type} text config: {error}") from error
