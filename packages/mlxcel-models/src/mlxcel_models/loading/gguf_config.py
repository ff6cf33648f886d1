"""GGUF metadata → the Hugging Face config.json keys mlx-lm's `ModelArgs` read.

llama.cpp's converter writes `{arch}.*` keys (gguf-py's `gguf.Keys`): `block_count` for
`num_hidden_layers`, `embedding_length` for `hidden_size`, `rope.freq_base` for
`rope_theta` and so on. `common_config` maps the keys every family shares, under every name
mlx-lm's families use for them (`ModelArgs.from_dict` keeps the ones its family declares);
the family functions add what one family needs beyond them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.dimensions import check_head_counts, positive_int


class GGUFMetadata:
    """A GGUF file's metadata as one architecture reads it.

    Args:
        metadata: the GGUF key/value metadata.
        tensor_names: the file's tensor names.
        architecture: `general.architecture`, the prefix of the family's keys.
        where: the file, for error messages.
    """

    def __init__(
        self,
        metadata: Mapping[str, Any],
        tensor_names: set[str],
        architecture: str,
        *,
        where: str | Path = "GGUF metadata",
    ) -> None:
        self.metadata = metadata
        self.tensor_names = tensor_names
        self.architecture = architecture
        self.where = where

    def get(self, key: str, default: Any = None) -> Any:
        """The value of `{architecture}.{key}`, or `default`."""
        value = self.metadata.get(f"{self.architecture}.{key}")
        return default if value is None else value

    def required(self, key: str) -> Any:
        """The value of `{architecture}.{key}`.

        Raises:
            ModelLoadError: the key is missing.
        """
        value = self.get(key)
        if value is None:
            raise ModelLoadError(f"{self.where} lacks {self.architecture}.{key}")
        return value

    def size(self, key: str, default: int | None = None) -> int:
        """A count or size: required without a `default`.

        Raises:
            ModelLoadError: it is missing (without a default) or not a positive integer.
        """
        value = self.required(key) if default is None else self.get(key, default)
        return positive_int(value, f"{self.architecture}.{key}", self.where)

    def has_tensor(self, name: str) -> bool:
        return name in self.tensor_names


def common_config(meta: GGUFMetadata) -> dict[str, Any]:
    """The config keys all decoder families share.

    Raises:
        ModelLoadError: a required hyperparameter is missing, a count or size is not a
            positive integer, or the query heads do not group over the KV heads.
    """
    arch = meta.architecture
    num_heads = meta.size("attention.head_count")
    num_kv_heads = meta.size("attention.head_count_kv", num_heads)
    check_head_counts(
        num_heads,
        num_kv_heads,
        names=(f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"),
        where=meta.where,
    )
    hidden_size = meta.size("embedding_length")
    if meta.get("attention.key_length") is None and hidden_size < num_heads:
        raise ModelLoadError(
            f"{meta.where}: {arch}.embedding_length ({hidden_size}) is smaller than "
            f"{arch}.attention.head_count ({num_heads}), leaving no features per head"
        )
    head_dim = meta.size("attention.key_length", hidden_size // num_heads)
    vocab = meta.metadata.get("tokenizer.ggml.tokens")
    # Multi-token-prediction layers come after the decoder's; mlx-lm does not run them.
    num_layers = meta.size("block_count") - int(meta.get("nextn_predict_layers", 0))
    expert_ffn = meta.get("expert_feed_forward_length")
    norm_eps = meta.get(
        "attention.layer_norm_rms_epsilon", meta.get("attention.layer_norm_epsilon")
    )
    if norm_eps is None:
        meta.required("attention.layer_norm_rms_epsilon")
    config: dict[str, Any] = {
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_layers": num_layers,
        "intermediate_size": meta.size("feed_forward_length", expert_ffn or None),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(norm_eps),
        "layer_norm_eps": float(norm_eps),
        "layer_norm_epsilon": float(norm_eps),
        "norm_epsilon": float(norm_eps),
        "norm_eps": float(norm_eps),
        "rope_theta": float(meta.get("rope.freq_base", 10000.0)),
        "vocab_size": len(vocab) if isinstance(vocab, list) else meta.size("vocab_size"),
        "max_position_embeddings": meta.size("context_length", 2048),
        "tie_word_embeddings": not meta.has_tensor("output.weight"),
        "attention_bias": meta.has_tensor("blk.0.attn_q.bias"),
        "mlp_bias": meta.has_tensor("blk.0.ffn_up.bias"),
    }
    rotary_dims = meta.get("rope.dimension_count")
    if rotary_dims is not None:
        config["partial_rotary_factor"] = rotary_dims / head_dim
    if (experts := meta.get("expert_count")) is not None:
        used = meta.size("expert_used_count")
        config |= {"num_experts": experts, "num_local_experts": experts}
        config |= {"n_routed_experts": experts, "num_experts_per_tok": used}
        config["moe_intermediate_size"] = int(expert_ffn or config["intermediate_size"])
    if (shared_ffn := meta.get("expert_shared_feed_forward_length")) is not None:
        config["shared_expert_intermediate_size"] = int(shared_ffn)
    if (window := meta.get("attention.sliding_window")) is not None:
        config["sliding_window"] = int(window)
    if (scaling := rope_scaling(meta)) is not None:
        config["rope_scaling"] = scaling
    return config


def rope_scaling(meta: GGUFMetadata) -> dict[str, Any] | None:
    """`rope_scaling` from `rope.scaling.*`: linear and YaRN (Llama 3 factors come as the
    `rope_freqs` tensor, Phi-3's LongRoPE as `rope_factors_*` tensors)."""
    kind = meta.get("rope.scaling.type")
    factor = meta.get("rope.scaling.factor")
    if kind in (None, "none") or factor is None:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "type": "linear", "factor": float(factor)}
    if kind == "yarn":
        scaling: dict[str, Any] = {"rope_type": "yarn", "type": "yarn", "factor": float(factor)}
        original = meta.get("rope.scaling.original_context_length")
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
        for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (value := meta.get(f"rope.scaling.{key}")) is not None:
                scaling[name] = float(value)
        return scaling
    return None


def layer_pattern(num_layers: int, period: int, *, local: str, full: str) -> list[str]:
    """Layer types repeating `period - 1` local layers then one full one (Gemma 3,
    Cohere 2), or alternating local and full for a period of 2 (gpt-oss)."""
    return [full if (i + 1) % period == 0 else local for i in range(num_layers)]


def gemma_query_scale(meta: GGUFMetadata, config: dict[str, Any], large_layers: int) -> float:
    """`query_pre_attn_scalar`, which GGUF does not store: llama.cpp scales queries by
    hidden / heads for the 27B Gemma 2 / 3 (told apart by their layer count) and by the
    head size otherwise."""
    if config["num_hidden_layers"] == large_layers:
        return config["hidden_size"] / config["num_attention_heads"]
    return float(config["head_dim"])
