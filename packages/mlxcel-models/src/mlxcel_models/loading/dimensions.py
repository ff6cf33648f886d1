"""Checks on the counts and sizes that shape a decoder, from config.json or GGUF metadata.

mlx-lm and the GGUF loader divide and reshape by these numbers (head_dim is the hidden size
over the heads; query heads are grouped over the KV heads), so a zero or a mismatch would
surface far from its cause, as a ZeroDivisionError or a reshape error. They are refused
here instead, naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxcel_models.errors import ModelLoadError

# config.json fields of a text decoder (Hugging Face names, as mlx-lm's ModelArgs reads them).
_CONFIG_SIZES = (
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
)


def positive_int(value: Any, name: str, where: str | Path) -> int:
    """`value` when it is a positive integer (written as one, or as a whole float such as
    2048.0, which some configs hold).

    Args:
        value: the number as read from the file.
        name: the field or metadata key it was read from.
        where: the file (or "GGUF metadata"), for the message.

    Raises:
        ModelLoadError: naming `where`, `name` and the value it holds.
    """
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value


def check_head_counts(
    num_heads: int, num_kv_heads: int, *, names: tuple[str, str], where: str | Path
) -> None:
    """Refuse query heads that do not split evenly into groups over the KV heads.

    Args:
        num_heads: query heads (positive).
        num_kv_heads: key/value heads (positive).
        names: the fields the two counts were read from, for the message.
        where: the file (or "GGUF metadata"), for the message.

    Raises:
        ModelLoadError: `num_heads` is not a multiple of `num_kv_heads`.
    """
    if num_heads % num_kv_heads:
        heads_name, kv_name = names
        raise ModelLoadError(
            f"{where}: {heads_name} ({num_heads}) must be a multiple of {kv_name} ({num_kv_heads})"
        )


def check_config_dimensions(config: Mapping[str, Any], config_path: Path) -> None:
    """Refuse a text decoder's config.json whose sizes no model can be built from.

    Fields that are absent (or null, where Hugging Face then uses a default) are not
    checked here; mlx-lm reports a missing required one.

    Args:
        config: the parsed config of a text decoder (a VLM's text config).
        config_path: the file it was read from, for the message.

    Raises:
        ModelLoadError: a count or size is not a positive integer, the query heads do not
            group over the KV heads, or, without head_dim, the hidden size is smaller than
            the number of heads.
    """
    sizes = {
        name: positive_int(config[name], name, config_path)
        for name in _CONFIG_SIZES
        if config.get(name) is not None
    }
    num_heads = sizes.get("num_attention_heads")
    if num_heads is None:
        return
    if "num_key_value_heads" in sizes:
        check_head_counts(
            num_heads,
            sizes["num_key_value_heads"],
            names=("num_attention_heads", "num_key_value_heads"),
            where=config_path,
        )
    hidden_size = sizes.get("hidden_size")
    if "head_dim" not in sizes and hidden_size is not None and hidden_size < num_heads:
        raise ModelLoadError(
            f"{config_path}: hidden_size ({hidden_size}) is smaller than num_attention_heads "
            f"({num_heads}), leaving no features per head"
        )
