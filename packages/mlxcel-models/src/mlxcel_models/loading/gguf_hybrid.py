"""GGUF metadata of the hybrid families, whose layers mix attention with state-space
short-convolution or gated-delta blocks (Jamba, Nemotron-H, Granite 4.0, LFM2,
Qwen3-Next).

llama.cpp's converter tells the layers apart with per-layer arrays rather than a pattern:
`attention.head_count_kv` is 0 on a layer without attention, and a layer's experts show as
its `ffn_gate_inp` router. The mlx-lm families read a layer-type list or an offset and a
period instead; they are rebuilt here from the arrays and the tensors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import mlx.core as mx

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_config import GGUFMetadata, common_config
from mlxcel_models.loading.gguf_family_configs import granite
from mlxcel_models.loading.gguf_layouts import TensorJoin

# Keys the converter writes per layer for hybrids, a scalar for other families.
_PER_LAYER_KEYS = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")


def per_layer(meta: GGUFMetadata, key: str) -> list[int]:
    """A per-layer array (`attention.head_count_kv`), or a scalar repeated per layer.

    Raises:
        ModelLoadError: an array whose length is not the layer count.
    """
    layers = meta.size("block_count")
    value = meta.required(key)
    if not isinstance(value, list):
        return [int(value)] * layers
    if len(value) != layers:
        raise ModelLoadError(
            f"{meta.where}: {meta.architecture}.{key} holds {len(value)} values for {layers} layers"
        )
    return [int(item) for item in value]


def hybrid_base_config(meta: GGUFMetadata) -> dict[str, Any]:
    """`common_config` with each per-layer array read as its largest value (the size of
    the layers that have the part).

    Raises:
        ModelLoadError: as `common_config`, or no layer has attention heads.
    """
    metadata = dict(meta.metadata)
    # Dense checkpoints of MoE-capable families are written with an expert count of 0.
    if metadata.get(f"{meta.architecture}.expert_count") == 0:
        del metadata[f"{meta.architecture}.expert_count"]
    for key in _PER_LAYER_KEYS:
        full_key = f"{meta.architecture}.{key}"
        if isinstance(metadata.get(full_key), list):
            if not any(metadata[full_key]):
                raise ModelLoadError(f"{meta.where}: no layer has a nonzero {full_key}")
            metadata[full_key] = max(metadata[full_key])
    scalars = GGUFMetadata(metadata, meta.tensor_names, meta.architecture, where=meta.where)
    return common_config(scalars)


def attention_layers(meta: GGUFMetadata) -> list[bool]:
    """Which layers have attention: those with KV heads."""
    return [heads > 0 for heads in per_layer(meta, "attention.head_count_kv")]


def _offset_and_period(layers: list[int], num_layers: int, what: str, meta: GGUFMetadata):
    """(offset, period) with (layer + offset) % period == 0 exactly on `layers`, as mlx-lm's
    Jamba places its experts."""
    period = layers[1] - layers[0] if len(layers) > 1 else num_layers
    offset = -layers[0] % period
    if [i for i in range(num_layers) if (i + offset) % period == 0] != layers:
        raise ModelLoadError(f"{meta.where}: the {what} layers {layers} repeat with no period")
    return offset, period


def jamba(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Jamba's layer types from the KV head counts, its expert layers from the routers,
    and its Mamba sizes."""
    num_layers = config["num_hidden_layers"]
    attention = attention_layers(meta)
    experts = [i for i in range(num_layers) if meta.has_tensor(f"blk.{i}.ffn_gate_inp.weight")]
    if all(attention):
        raise ModelLoadError(f"{meta.where}: every layer has attention; Jamba needs Mamba layers")
    mamba = attention.index(False)
    expert_offset, expert_period = (
        _offset_and_period(experts, num_layers, "expert", meta) if experts else (0, 1)
    )
    return {
        "layers_block_type": ["attention" if a else "mamba" for a in attention],
        "attn_layer_offset": attention.index(True),
        "attn_layer_period": num_layers,
        "expert_layer_offset": expert_offset,
        "expert_layer_period": expert_period,
        "num_experts": config.get("num_experts", 1) if experts else 1,
        "num_experts_per_tok": config.get("num_experts_per_tok", 1),
        "mamba_d_conv": meta.size("ssm.conv_kernel"),
        "mamba_d_state": meta.size("ssm.state_size"),
        "mamba_expand": meta.size("ssm.inner_size") // config["hidden_size"],
        "mamba_dt_rank": meta.size("ssm.time_step_rank"),
        "mamba_proj_bias": meta.has_tensor(f"blk.{mamba}.ssm_in.bias"),
        "mamba_conv_bias": meta.has_tensor(f"blk.{mamba}.ssm_conv1d.bias"),
    }


def _first(layers: list[str], kind: str) -> int | None:
    return layers.index(kind) if kind in layers else None


def nemotron_h(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H's block pattern (M Mamba 2, * attention, - MLP, E experts), each layer
    one of them: attention where it has KV heads, an MLP where it has a feed-forward
    length, Mamba 2 otherwise. llama.cpp does not clamp the time step."""
    kv_heads = per_layer(meta, "attention.head_count_kv")
    ffn = per_layer(meta, "feed_forward_length")
    mlp = "E" if meta.get("expert_count") is not None else "-"
    pattern = ["*" if k else (mlp if f else "M") for k, f in zip(kv_heads, ffn, strict=True)]
    # A multi-token-prediction block the converter appends is not part of the decoder.
    pattern = pattern[: config["num_hidden_layers"]]
    mamba, attention, dense = (_first(pattern, kind) for kind in ("M", "*", mlp))
    inner = meta.size("ssm.inner_size")
    heads = meta.size("ssm.time_step_rank")
    experts = _nemotron_h_experts(meta, config) if mlp == "E" else {}
    return experts | {
        "hybrid_override_pattern": pattern,
        "mamba_num_heads": heads,
        "mamba_head_dim": inner // heads,
        "ssm_state_size": meta.size("ssm.state_size"),
        "conv_kernel": meta.size("ssm.conv_kernel"),
        "n_groups": meta.size("ssm.group_count", 1),
        "mamba_proj_bias": meta.has_tensor(f"blk.{mamba}.ssm_in.bias"),
        "use_bias": meta.has_tensor(f"blk.{mamba}.ssm_in.bias"),
        "use_conv_bias": meta.has_tensor(f"blk.{mamba}.ssm_conv1d.bias"),
        "attention_bias": meta.has_tensor(f"blk.{attention}.attn_q.bias"),
        "mlp_bias": meta.has_tensor(f"blk.{dense}.ffn_up.bias"),
        "time_step_limit": (0.0, float("inf")),
    }


def granite_hybrid(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Granite 4.0's hybrid: attention and Mamba 2 layer types from the KV head counts,
    Granite's multipliers, RoPE only where the converter flags it (it reuses
    `rope.scaling.finetuned` for that), experts with a shared MLP or a dense MLP whose size
    is the shared one. llama.cpp does not clamp the time step."""
    attention = attention_layers(meta)
    mamba = attention.index(False) if not all(attention) else 0
    inner = meta.size("ssm.inner_size")
    heads = meta.size("ssm.time_step_rank")
    experts = config.get("num_experts")
    shared = meta.get("expert_shared_feed_forward_length")
    sizes = {"num_local_experts": experts, "shared_intermediate_size": shared}
    if not experts and shared is not None:
        sizes["intermediate_size"] = int(shared)
    return (
        granite(meta, config)
        | sizes
        | {
            "layer_types": ["attention" if a else "mamba" for a in attention],
            "position_embedding_type": "rope" if meta.get("rope.scaling.finetuned") else "nope",
            "mamba_n_heads": heads,
            "mamba_d_head": inner // heads,
            "mamba_d_state": meta.size("ssm.state_size"),
            "mamba_d_conv": meta.size("ssm.conv_kernel"),
            "mamba_n_groups": meta.size("ssm.group_count", 1),
            "mamba_proj_bias": meta.has_tensor(f"blk.{mamba}.ssm_in.bias"),
            "mamba_conv_bias": meta.has_tensor(f"blk.{mamba}.ssm_conv1d.bias"),
            "time_step_limit": (0.0, float("inf")),
        }
    )


def _shared_input_linear(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array] | None:
    """Granite's shared-expert `input_linear` (gate rows, then up rows), which the converter
    splits into `ffn_gate_shexp` and `ffn_up_shexp`."""
    if any(f"ffn_{part}_shexp.weight" not in tensors for part in ("gate", "up")):
        return None
    gate, up = tensors["ffn_gate_shexp.weight"], tensors["ffn_up_shexp.weight"]
    return {"shared_mlp.input_linear.weight": mx.concatenate([gate, up])}


GRANITE_SHARED_INPUT = TensorJoin(
    frozenset({"ffn_gate_shexp.weight", "ffn_up_shexp.weight"}), _shared_input_linear
)


def _nemotron_h_experts(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H MoE's router and experts. The converter writes no group-limited routing
    (`expert_group_used_count`), so llama.cpp's top-k is over all groups."""
    groups = meta.get("expert_group_count", 1)
    return {
        "n_routed_experts": config["num_experts"],
        "moe_intermediate_size": config["moe_intermediate_size"],
        "moe_shared_expert_intermediate_size": meta.get("expert_shared_feed_forward_length"),
        "n_shared_experts": meta.get("expert_shared_count") or None,
        "moe_latent_size": meta.get("moe_latent_size"),
        "norm_topk_prob": bool(meta.get("expert_weights_norm", False)),
        "routed_scaling_factor": float(meta.get("expert_weights_scale", 1.0)),
        "n_group": groups,
        "topk_group": meta.get("expert_group_used_count", groups),
    }


def nemotron_h_expert_names(path: str) -> str:
    """The name gguf-py gives Nemotron-H's stacked experts (`fc1` up, `fc2` down): the
    converter merges them under `model.layers.N.mlp.experts`, not `backbone.layers`."""
    match = re.fullmatch(r"backbone\.layers\.(\d+)\.mixer\.switch_mlp\.fc([12])\.(\w+)", path)
    if match is None:
        return path
    layer, fc, suffix = match.groups()
    projection = "up_proj" if fc == "1" else "down_proj"
    return f"model.layers.{layer}.mlp.experts.{projection}.{suffix}"


def lfm2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """LFM2's layer types from the KV head counts; the converter stores the feed-forward
    size already adjusted (`block_auto_adjust_ff_dim`), so it is taken as it is."""
    attention = attention_layers(meta)
    conv = attention.index(False) if not all(attention) else 0
    return {
        "layer_types": ["full_attention" if a else "conv" for a in attention],
        "block_dim": config["hidden_size"],
        "block_ff_dim": config["intermediate_size"],
        "block_auto_adjust_ff_dim": False,
        "block_multiple_of": 1,
        "block_ffn_dim_multiplier": 1.0,
        "conv_L_cache": meta.size("shortconv.l_cache"),
        "conv_bias": meta.has_tensor(f"blk.{conv}.shortconv.in_proj.bias"),
    }


def lfm2_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """LFM2-MoE: LFM2's layers, dense MLPs on the leading layers, then sigmoid-routed
    experts whose top-k weights llama.cpp normalizes and does not scale."""
    return lfm2(meta, config) | {
        "num_dense_layers": meta.get("leading_dense_block_count", 0),
        "use_expert_bias": any(
            meta.has_tensor(f"blk.{i}.exp_probs_b.bias") for i in range(config["num_hidden_layers"])
        ),
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
    }


def qwen3_next(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-Next's gated-delta sizes, which the converter stores under `ssm.*`: the key
    head size as the state size, the key heads as groups, the value heads as the time-step
    rank. Its norms are stored as `1 + w`, the form mlx-lm runs them in. Layers without a
    router have a dense MLP; llama.cpp normalizes the top-k expert weights."""
    value_heads = meta.size("ssm.time_step_rank")
    layers = config["num_hidden_layers"]
    return {
        "linear_num_value_heads": value_heads,
        "linear_num_key_heads": meta.size("ssm.group_count"),
        "linear_key_head_dim": meta.size("ssm.state_size"),
        "linear_value_head_dim": meta.size("ssm.inner_size") // value_heads,
        "linear_conv_kernel_dim": meta.size("ssm.conv_kernel"),
        "full_attention_interval": meta.size("full_attention_interval", 4),
        "decoder_sparse_step": 1,
        "mlp_only_layers": [
            i for i in range(layers) if not meta.has_tensor(f"blk.{i}.ffn_gate_inp.weight")
        ],
        "norm_topk_prob": bool(meta.get("expert_weights_norm", True)),
        "partial_rotary_factor": config.get("partial_rotary_factor", 1.0),
        "rope_scaling": config.get("rope_scaling"),
    }


def _gated_delta_in_proj(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array] | None:
    """Qwen3-Next's `in_proj_qkvz`, rows grouped per key head as (q, k, v, z), from the
    converter's `attn_qkv` (all queries, all keys, all values) and `attn_gate` (z)."""
    if "attn_qkv.weight" not in tensors or "attn_gate.weight" not in tensors:
        return None
    key_heads = config["linear_num_key_heads"]
    key_rows = key_heads * config["linear_key_head_dim"]
    qkv, z = tensors["attn_qkv.weight"], tensors["attn_gate.weight"]
    q, k, v = qkv[:key_rows], qkv[key_rows : 2 * key_rows], qkv[2 * key_rows :]
    grouped = [part.reshape(key_heads, -1, part.shape[-1]) for part in (q, k, v, z)]
    joined = mx.concatenate(grouped, axis=1).reshape(-1, qkv.shape[-1])
    return {"linear_attn.in_proj_qkvz.weight": joined}


GATED_DELTA_IN_PROJ = TensorJoin(
    frozenset({"attn_qkv.weight", "attn_gate.weight"}), _gated_delta_in_proj
)
