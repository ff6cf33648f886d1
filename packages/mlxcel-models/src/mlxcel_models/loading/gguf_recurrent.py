"""GGUF metadata and tensor layouts of the state-space families (Mamba, Mamba 2) and the
hybrids built on them.

llama.cpp's converter writes their sizes under `{arch}.ssm.*` (`conv_kernel`,
`inner_size`, `state_size`, `time_step_rank`, `group_count`), stores the decay `A` instead
of the trained `A_log` (`A = -exp(A_log)`), squeezes the depthwise convolution's kernel to
(channels, width) and, for Mamba 2, gives `A` and `D` a trailing axis and the gated norm a
(groups, channels / groups) shape. The loader reshapes the tensors back
(`GGUFArchitecture.reshaped_tensors`) and takes the logarithm back here.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_config import GGUFMetadata

# The tensors whose size-one axes the converter drops or adds, by GGUF base name.
SSM_RESHAPED = frozenset({"ssm_conv1d", "ssm_a", "ssm_d", "ssm_norm"})


def ssm_base_config(meta: GGUFMetadata) -> dict[str, Any]:
    """The config keys of a decoder without attention heads: sizes, norm epsilon, vocab.

    Raises:
        ModelLoadError: a required size is missing or not a positive integer.
    """
    vocab = meta.metadata.get("tokenizer.ggml.tokens")
    norm_eps = meta.get(
        "attention.layer_norm_rms_epsilon", meta.get("attention.layer_norm_epsilon")
    )
    if norm_eps is None:
        meta.required("attention.layer_norm_rms_epsilon")
    num_layers = meta.size("block_count")
    return {
        "hidden_size": meta.size("embedding_length"),
        "num_hidden_layers": num_layers,
        "num_layers": num_layers,
        "vocab_size": len(vocab) if isinstance(vocab, list) else meta.size("vocab_size"),
        "tie_word_embeddings": not meta.has_tensor("output.weight"),
        "rms_norm_eps": float(norm_eps),
        "layer_norm_epsilon": float(norm_eps),
        "norm_eps": float(norm_eps),
        "max_position_embeddings": meta.size("context_length", 2048),
    }


def mamba(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Mamba's sizes; Falcon Mamba's RMS norms of dt, B and C come as `ssm.dt_b_c_rms`."""
    return {
        "intermediate_size": meta.size("ssm.inner_size"),
        "state_size": meta.size("ssm.state_size"),
        "conv_kernel": meta.size("ssm.conv_kernel"),
        "time_step_rank": meta.size("ssm.time_step_rank"),
        "use_bias": meta.has_tensor("blk.0.ssm_in.bias"),
        "use_conv_bias": meta.has_tensor("blk.0.ssm_conv1d.bias"),
        "use_bcdt_rms": bool(meta.get("ssm.dt_b_c_rms", False)),
    }


def mamba2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Mamba 2's sizes: the converter stores the head count as `ssm.time_step_rank`.
    llama.cpp does not clamp the time step, as `time_step_limit` (0, inf) does not."""
    inner = meta.size("ssm.inner_size")
    heads = meta.size("ssm.time_step_rank")
    return {
        "intermediate_size": inner,
        "num_heads": heads,
        "head_dim": inner // heads,
        "time_step_rank": heads,
        "state_size": meta.size("ssm.state_size"),
        "conv_kernel": meta.size("ssm.conv_kernel"),
        "n_groups": meta.size("ssm.group_count", 1),
        "use_bias": meta.has_tensor("blk.0.ssm_in.bias"),
        "use_conv_bias": meta.has_tensor("blk.0.ssm_conv1d.bias"),
        "time_step_limit": (0.0, float("inf")),
    }


def falcon_h1(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Falcon-H1's attention and Mamba 2 sizes. The converter folds every multiplier into
    the weights (as mlx-lm's sanitize does for a checkpoint), so the file's weights run with
    all of them at 1; llama.cpp gates before its norm (`mamba_norm_before_gate` false)."""
    inner = meta.size("ssm.inner_size")
    heads = meta.size("ssm.time_step_rank")
    multipliers = {
        "attention_in_multiplier": 1.0,
        "attention_out_multiplier": 1.0,
        "embedding_multiplier": 1.0,
        "key_multiplier": 1.0,
        "lm_head_multiplier": 1.0,
        "ssm_in_multiplier": 1.0,
        "ssm_out_multiplier": 1.0,
        "mlp_multipliers": [1.0, 1.0],
        "ssm_multipliers": [1.0] * 5,
    }
    return multipliers | {
        "mamba_d_ssm": inner,
        "mamba_n_heads": heads,
        "mamba_d_head": inner // heads,
        "mamba_d_state": meta.size("ssm.state_size"),
        "mamba_d_conv": meta.size("ssm.conv_kernel"),
        "mamba_n_groups": meta.size("ssm.group_count", 1),
        "mamba_conv_bias": meta.has_tensor("blk.0.ssm_conv1d.bias"),
        "mamba_proj_bias": meta.has_tensor("blk.0.ssm_in.bias"),
        "mamba_rms_norm": meta.has_tensor("blk.0.ssm_norm.weight"),
        "mamba_norm_before_gate": False,
        "projectors_bias": meta.has_tensor("blk.0.ssm_out.bias"),
        "attention_bias": config["attention_bias"],
        "mlp_bias": meta.has_tensor("blk.0.ffn_up.bias"),
        "rope_traditional": False,
    }


def restore_ssm_decay(
    base: str, arrays: dict[str, mx.array], config: dict[str, Any]
) -> dict[str, mx.array]:
    """`A_log` back from the stored decay `A = -exp(A_log)`.

    Raises:
        ModelLoadError: a decay is not negative, so no `A_log` gives it.
    """
    if base != "ssm_a":
        return arrays
    decay = arrays["weight"].astype(mx.float32)
    if not bool(mx.all(decay < 0)):
        raise ModelLoadError("ssm_a holds a decay that is not negative; A = -exp(A_log) < 0")
    return {"weight": mx.log(-decay)}
