"""The text model's settings inside a vision-language model's config.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoConfig

from mlxcel_models.errors import ModelLoadError


def vlm_text_config(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """The text model's Hugging Face config of a vision-language `config`, complete.

    Checkpoints often write only what differs from transformers' defaults for the text
    model (older LLaVA folders name little more than the vocabulary size), so the config is
    read through transformers' config classes, which fill in the rest. transformers 5 moves
    `rope_theta` into `rope_parameters`; it is copied back to the fields mlx-lm reads
    (`rope_theta`, and `rope_scaling` for a scaled RoPE).

    Args:
        config: the parsed config.json of the folder `where`.

    Raises:
        ModelLoadError: transformers does not know the model type or rejects the config.
    """
    settings = {key: value for key, value in config.items() if key != "model_type"}
    try:
        parsed = AutoConfig.for_model(config["model_type"], **settings)
    # transformers' config classes validate types and values as they are built.
    except (KeyError, ValueError, TypeError) as error:
        raise ModelLoadError(f"{where / 'config.json'}: {error}") from error
    text = parsed.get_text_config().to_dict()
    rope = text.get("rope_parameters") or {}
    if "rope_theta" not in text and "rope_theta" in rope:
        text["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default" and not text.get("rope_scaling"):
        text["rope_scaling"] = rope
    return text
