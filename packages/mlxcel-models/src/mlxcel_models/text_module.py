"""mlx-lm text architectures built from a Hugging Face text config, for models whose
language model is one part of a larger folder (a vision-language model's `text_config`)."""

from __future__ import annotations

import importlib
from typing import Any

import mlx.nn as nn

from mlxcel_models.errors import ModelLoadError


def make_text_module(config: dict[str, Any]) -> nn.Module:
    """An mlx-lm `Model` (random weights) for a text config as transformers 4 or 5 writes it.

    transformers 5 nests `rope_theta` and any scaling in `rope_parameters`; mlx-lm reads the
    transformers 4 fields, so they are unpacked first.

    Args:
        config: the text config; its `model_type` names the mlx-lm architecture (llama when
            absent, as Idefics3 and LLaVA configs default it).

    Raises:
        ModelLoadError: mlx-lm has no such architecture or the config does not fit it.
    """
    model_type = config.get("model_type", "llama")
    try:
        architecture = importlib.import_module(f"mlx_lm.models.{model_type}")
    except ModuleNotFoundError as error:
        raise ModelLoadError(f"unsupported text model type '{model_type}'") from error
    try:
        args = architecture.ModelArgs.from_dict({**config, **_rope_fields(config)})
        return architecture.Model(args)
    # mlx-lm reports a config missing a field as the ModelArgs constructor's TypeError.
    except (TypeError, ValueError, KeyError) as error:
        raise ModelLoadError(f"the {model_type} text config is not valid: {error}") from error


def _rope_fields(config: dict[str, Any]) -> dict[str, Any]:
    parameters = config.get("rope_parameters")
    if not parameters:
        return {}
    fields: dict[str, Any] = {"rope_theta": parameters.get("rope_theta", 10000.0)}
    if parameters.get("rope_type", "default") != "default":
        fields["rope_scaling"] = parameters
    return fields
