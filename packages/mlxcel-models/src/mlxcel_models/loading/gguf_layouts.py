"""Tensor layouts llama.cpp's converter changes, and how the loader puts them back.

Most changes touch one tensor (`unpermute_rope_rows`, `unpermute_xverse_rows`,
`unshuffle_plamo_heads`, `interleave_neox_qkv`); some split one Hugging Face parameter into
several GGUF tensors (InternLM 2's fused `wqkv`, Ling's `query_key_value`, DeepSeek's
`kv_b_proj`), which a `TensorJoin` puts back together once a layer's parts are all read;
DBRX's stacked experts are split into mlx-lm's one MLP per expert the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

JoinFunction = Callable[[Mapping[str, mx.array], Mapping[str, Any]], dict[str, mx.array] | None]

# llama.cpp's quantizer drops the size-one axis of a shared expert's gate, (1, hidden): the
# loader reshapes it back (`GGUFArchitecture.reshaped_tensors`).
SHARED_EXPERT_GATE = frozenset({"ffn_gate_inp_shexp"})


@dataclass(frozen=True)
class TensorJoin:
    """GGUF tensors of one layer that become mlx-lm parameters together.

    Attributes:
        names: the tensors' names within a layer (`attn_q.weight`).
        join: from the layer's tensors read so far (dense, by those names) and the config,
            the parameters by path within the layer (`attention.wqkv.weight`); None while
            a part is still to come.
        layers_path: the mlx-lm path of the decoder's layer list.
    """

    names: frozenset[str]
    join: JoinFunction
    layers_path: str = "model.layers"


def unpermute_rope_rows(weight: mx.array, num_heads: int) -> mx.array:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE) for half-split RoPE.

    llama.cpp's converter reshapes rows to (heads, 2, head_dim / 2) and swaps the last two
    axes; this applies the inverse. Works on packed quantized rows, scales and biases alike.

    Args:
        weight: (num_heads * head_dim, ...) projection rows.
    """
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def unpermute_xverse_rows(
    base: str, arrays: dict[str, mx.array], config: dict[str, Any]
) -> dict[str, mx.array]:
    """Undo XVERSE's Q/K row permutation, which for grouped keys splits the rows into
    heads / kv_heads groups rather than one per KV head."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    if base == "attn_q":
        groups = heads
    elif base == "attn_k":
        groups = heads if kv_heads == heads else heads // kv_heads
    else:
        return arrays
    return {key: unpermute_rope_rows(value, groups) for key, value in arrays.items()}


def unshuffle_plamo_heads(
    base: str, arrays: dict[str, mx.array], config: dict[str, Any]
) -> dict[str, mx.array]:
    """Undo the converter's reorder of PLaMo's query heads from (shared, kv) order, which
    mlx-lm tiles its KV heads for, to llama.cpp's (kv, shared): the rows of `attn_q` and the
    input columns of `attn_output`, in any packing (a head's columns are whole groups)."""
    kv = config["num_key_value_heads"]
    shared = config["num_attention_heads"] // kv
    if base == "attn_q":
        return {
            key: value.reshape(kv, shared, -1, *value.shape[1:]).swapaxes(0, 1).reshape(value.shape)
            for key, value in arrays.items()
        }
    if base == "attn_output":
        return {
            key: value.reshape(*value.shape[:-1], kv, shared, -1)
            .swapaxes(-3, -2)
            .reshape(value.shape)
            for key, value in arrays.items()
        }
    return arrays


def interleave_neox_qkv(
    base: str, arrays: dict[str, mx.array], config: dict[str, Any]
) -> dict[str, mx.array]:
    """Put GPT-NeoX's fused `attn_qkv` rows back in its per-head (query, key, value) order;
    the converter stores all queries, then all keys, then all values. Any packing."""
    if base != "attn_qkv":
        return arrays
    heads = config["num_attention_heads"]
    return {
        key: value.reshape(3, heads, -1, *value.shape[1:]).swapaxes(0, 1).reshape(value.shape)
        for key, value in arrays.items()
    }


def _internlm2_wqkv(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array] | None:
    """InternLM 2's `wqkv`, rows grouped per KV head as (q_per_kv queries, key, value), from
    the converter's separate `attn_q` / `attn_k` (RoPE-permuted) and `attn_v`."""
    suffixes = ("weight", "bias") if config["bias"] else ("weight",)
    if any(f"attn_{part}.{suffix}" not in tensors for part in "qkv" for suffix in suffixes):
        return None
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    joined = {}
    for suffix in suffixes:
        q = unpermute_rope_rows(tensors[f"attn_q.{suffix}"], heads)
        k = unpermute_rope_rows(tensors[f"attn_k.{suffix}"], kv_heads)
        v = tensors[f"attn_v.{suffix}"]
        rest = q.shape[1:]
        groups = [
            q.reshape(kv_heads, heads // kv_heads, -1, *rest),
            k.reshape(kv_heads, 1, -1, *rest),
            v.reshape(kv_heads, 1, -1, *rest),
        ]
        joined[f"attention.wqkv.{suffix}"] = mx.concatenate(groups, axis=1).reshape(-1, *rest)
    return joined


INTERNLM2_WQKV = TensorJoin(
    frozenset(f"attn_{part}.{suffix}" for part in "qkv" for suffix in ("weight", "bias")),
    _internlm2_wqkv,
)


def _bailing_query_key_value(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array] | None:
    """Ling's fused `query_key_value`, queries then keys then values, from the converter's
    separate `attn_q` / `attn_k` (RoPE-permuted) and `attn_v`."""
    suffixes = ("weight", "bias") if config["use_qkv_bias"] else ("weight",)
    if any(f"attn_{part}.{suffix}" not in tensors for part in "qkv" for suffix in suffixes):
        return None
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    return {
        f"attention.query_key_value.{suffix}": mx.concatenate(
            [
                unpermute_rope_rows(tensors[f"attn_q.{suffix}"], heads),
                unpermute_rope_rows(tensors[f"attn_k.{suffix}"], kv_heads),
                tensors[f"attn_v.{suffix}"],
            ]
        )
        for suffix in suffixes
    }


BAILING_QUERY_KEY_VALUE = TensorJoin(INTERNLM2_WQKV.names, _bailing_query_key_value)


def _dbrx_experts(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array] | None:
    """DBRX's experts, one MLP each in mlx-lm, from the converter's stacked tensors: gate
    (`w1`) and up (`v1`) as (experts, ffn, hidden), down (`w2`) as (experts, hidden, ffn)."""
    parts = {"ffn_gate_exps.weight": "w1", "ffn_up_exps.weight": "v1"}
    parts["ffn_down_exps.weight"] = "w2"
    if any(name not in tensors for name in parts):
        return None
    return {
        f"ffn.experts.{expert}.{projection}.weight": tensors[name][expert]
        for name, projection in parts.items()
        for expert in range(tensors[name].shape[0])
    }


DBRX_EXPERTS = TensorJoin(
    frozenset({"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}),
    _dbrx_experts,
    layers_path="transformer.blocks",
)
