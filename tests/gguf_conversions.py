"""What llama.cpp's converter does to some families' tensors on the way to GGUF, applied to
a tiny mlx-lm model's weights (Hugging Face names) by `write_converted_gguf`: each function
takes one tensor and yields those the converter writes for it (`ConvertedFamily.split_tensor`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from factories import llama_cpp_permute


def split_kv_b(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """The converter's split of `kv_b_proj` into per-head `k_b_proj` (transposed) and
    `v_b_proj`."""
    if not name.endswith("kv_b_proj.weight"):
        yield name, weight
        return
    nope = config["qk_nope_head_dim"]
    per_head = weight.reshape(config["num_attention_heads"], -1, weight.shape[-1])
    yield (
        name.replace("kv_b_proj", "k_b_proj"),
        np.ascontiguousarray(per_head[:, :nope].transpose(0, 2, 1)),
    )
    yield name.replace("kv_b_proj", "v_b_proj"), np.ascontiguousarray(per_head[:, nope:])


_XIELU = ("alpha_p", "alpha_n", "beta", "eps")


def drop_xielu(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """Apertus's xIELU constants leave the tensors for the metadata (`xielu_metadata`)."""
    if ".act_fn." not in name:
        yield name, weight


def xielu_metadata(weights: dict[str, np.ndarray]) -> dict[str, Any]:
    layers = sorted({int(name.split(".")[2]) for name in weights if ".act_fn." in name})
    return {
        f"xielu_{constant}": [
            float(weights[f"model.layers.{layer}.mlp.act_fn.{constant}"]) for layer in layers
        ]
        for constant in _XIELU
    }


def unshuffle_plamo(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """The converter's reorder of PLaMo's query heads into llama.cpp's grouped order."""
    kv = config["num_attention_heads"] // config["n_shared_head"]
    shared = config["n_shared_head"]
    if name.endswith("q_proj.weight"):
        rows = weight.reshape(shared, kv, -1, weight.shape[-1]).transpose(1, 0, 2, 3)
        weight = rows.reshape(weight.shape)
    elif name.endswith("o_proj.weight"):
        columns = weight.reshape(weight.shape[0], shared, kv, -1).transpose(0, 2, 1, 3)
        weight = columns.reshape(weight.shape)
    yield name, np.ascontiguousarray(weight)


def split_wqkv(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """The converter's split of InternLM 2's grouped `wqkv` into Q, K (both permuted for
    llama.cpp's RoPE) and V."""
    if ".wqkv." not in name:
        yield name, weight
        return
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    rest = weight.shape[1:]
    groups = weight.reshape(kv_heads, heads // kv_heads + 2, -1, *rest)
    q = groups[:, :-2].reshape(-1, *rest)
    k = groups[:, -2].reshape(-1, *rest)
    v = groups[:, -1].reshape(-1, *rest)
    prefix, suffix = name.split(".attention.wqkv.")
    yield f"{prefix}.self_attn.q_proj.{suffix}", llama_cpp_permute(q, heads)
    yield f"{prefix}.self_attn.k_proj.{suffix}", llama_cpp_permute(k, kv_heads)
    yield f"{prefix}.self_attn.v_proj.{suffix}", np.ascontiguousarray(v)


def add_nextn_layer(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """A multi-token-prediction layer after the decoder's, as GLM-4.5 files hold one."""
    yield name, weight
    if name == "model.norm.weight":
        yield f"blk.{config['num_hidden_layers']}.nextn.shared_head_norm.weight", weight


def add_expert_bias(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """ERNIE 4.5's aux-loss-free expert bias, which mlx-lm's family does not use."""
    yield name, weight
    if name.endswith("mlp.gate.weight"):
        layer = name.split(".")[2]
        yield f"blk.{layer}.exp_probs_b.bias", np.zeros(weight.shape[0], np.float32)


def split_neox_qkv(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """The converter's reorder of GPT-NeoX's per-head (q, k, v) rows into all queries, then
    all keys, then all values."""
    if ".query_key_value." in name:
        heads = config["num_attention_heads"]
        rows = weight.reshape(heads, 3, -1, *weight.shape[1:]).swapaxes(0, 1)
        weight = np.ascontiguousarray(rows.reshape(weight.shape))
    yield name, weight


def split_query_key_value(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """The converter's split of Ling's `query_key_value` into Q, K (both permuted for
    llama.cpp's RoPE) and V."""
    if ".query_key_value." not in name:
        yield name, weight
        return
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    q_rows, kv_rows = heads * config["head_dim"], kv_heads * config["head_dim"]
    q, k, v = np.split(weight, [q_rows, q_rows + kv_rows])
    prefix, suffix = name.split(".attention.query_key_value.")
    yield f"{prefix}.self_attn.q_proj.{suffix}", llama_cpp_permute(q, heads)
    yield f"{prefix}.self_attn.k_proj.{suffix}", llama_cpp_permute(k, kv_heads)
    yield f"{prefix}.self_attn.v_proj.{suffix}", np.ascontiguousarray(v)


def add_longrope_factors(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """The converter's move of LongRoPE factors from the config into two tensors."""
    yield name, weight
    if name == "model.norm.weight":
        for kind in ("long", "short"):
            factors = np.array(config["rope_scaling"][f"{kind}_factor"], np.float32)
            yield f"rope_factors_{kind}.weight", factors


def permute_xverse(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """XVERSE's Q/K permutation, whose keys split into heads / kv_heads groups."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    if name.endswith("q_proj.weight"):
        weight = llama_cpp_permute(weight, heads)
    elif name.endswith("k_proj.weight"):
        weight = llama_cpp_permute(weight, heads if kv_heads == heads else heads // kv_heads)
    yield name, weight
