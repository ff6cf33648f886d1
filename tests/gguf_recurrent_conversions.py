"""The converter's tensor rewrites for the state-space and hybrid families
(`gguf_recurrent_families`): each takes an mlx-lm tensor and yields the GGUF tensors
llama.cpp's converter writes for it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


def store_mamba_tensors(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """The decay `A = -exp(A_log)` in place of `A_log`, the convolution kernel squeezed to
    (channels, width)."""
    if name.endswith(".A_log"):
        weight = -np.exp(weight)
    elif name.endswith("conv1d.weight"):
        weight = weight.squeeze()
    yield name, np.ascontiguousarray(weight)


def store_mamba2_tensors(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """Mamba's changes, with `A` and `D` given a trailing axis and the gated norm's weight
    shaped (groups, channels / groups)."""
    if name.endswith((".A_log", ".D")):
        weight = weight.reshape(-1, 1)
    elif name.endswith(("mixer.norm.weight", "mamba.norm.weight")):
        groups = config.get("n_groups", config.get("mamba_n_groups"))
        weight = weight.reshape(groups, -1)
    yield from store_mamba_tensors(name, weight, config)


def store_granite_hybrid_tensors(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """Mamba 2's changes, and the shared expert's `input_linear` split into gate and up."""
    if name.endswith("shared_mlp.input_linear.weight"):
        layer = name.split(".")[2]
        gate, up = np.split(weight, 2)
        yield f"blk.{layer}.ffn_gate_shexp.weight", np.ascontiguousarray(gate)
        yield f"blk.{layer}.ffn_up_shexp.weight", np.ascontiguousarray(up)
        return
    yield from store_mamba2_tensors(name, weight, config)


def squeeze_short_conv(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """LFM2's short-convolution kernel squeezed to (channels, width)."""
    yield name, np.ascontiguousarray(weight.squeeze()) if "conv.conv." in name else weight


def split_in_proj_qkvz(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """Mamba's changes, and Qwen3-Next's `in_proj_qkvz` (grouped per key head) split into
    all queries, keys and values (`attn_qkv`) and the gate (`attn_gate`)."""
    if not name.endswith("in_proj_qkvz.weight"):
        yield from store_mamba_tensors(name, weight, config)
        return
    key_heads, key_dim = config["linear_num_key_heads"], config["linear_key_head_dim"]
    value_rows = config["linear_num_value_heads"] // key_heads * config["linear_value_head_dim"]
    grouped = weight.reshape(key_heads, -1, weight.shape[-1])
    q, k, v, z = np.split(grouped, np.cumsum([key_dim, key_dim, value_rows]), axis=1)
    layer = name.split(".")[2]
    qkv = np.concatenate([part.reshape(-1, weight.shape[-1]) for part in (q, k, v)])
    yield f"blk.{layer}.attn_qkv.weight", np.ascontiguousarray(qkv)
    yield f"blk.{layer}.attn_gate.weight", np.ascontiguousarray(z.reshape(-1, weight.shape[-1]))


RWKV7_NAMES = (
    ("_lora.lora.0.weight", "1.weight"),
    ("_lora.lora.2.weight", "2.weight"),
    ("_lora.lora.2.bias", "0.weight"),
    ("ffn", "feed_forward"),
    ("attn", "attention"),
    ("feed_forward_norm", "ln2"),
    ("g_norm", "ln_x"),
)
# gguf-py's names of the parameters without a suffix, which the converter adds.
_RWKV7_VECTORS = {"attention.k_k": "time_mix_k_k", "attention.k_a": "time_mix_k_a"}
_RWKV7_VECTORS |= {"attention.r_k": "time_mix_r_k", "feed_forward.x_k": "channel_mix_lerp_k"}
_RWKV7_MIXES = ("r", "w", "k", "v", "a", "g")


def stack_rwkv7_mixes(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The six token-shift mixes of each layer stacked into `time_mix_lerp_fused`."""
    merged = {name: weight for name, weight in weights.items() if ".attn.x_" not in name}
    layers = {name.split(".")[2] for name in weights if ".attn.x_" in name}
    for layer in sorted(layers):
        mixes = [weights[f"model.layers.{layer}.attn.x_{mix}"] for mix in _RWKV7_MIXES]
        merged[f"blk.{layer}.time_mix_lerp_fused.weight"] = np.stack(mixes)
    return merged


def convert_rwkv7(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """The converter's other RWKV-7 changes: every tensor squeezed, the suffix-less vectors
    named `.weight`, and layer 0 given its `a` LoRA again as the value-residual LoRA."""
    if name.startswith("model.layers."):
        layer, within = name.split(".", 3)[2:]
        if within in _RWKV7_VECTORS:
            yield f"blk.{layer}.{_RWKV7_VECTORS[within]}.weight", weight.reshape(-1)
            return
        if layer == "0" and within.startswith("attention.a"):
            suffix = within.removeprefix("attention.a")
            yield f"model.layers.0.attention.v{suffix}", np.ascontiguousarray(weight.squeeze())
    yield name, weight if name.startswith("blk.") else np.ascontiguousarray(weight.squeeze())


def store_nemotron_h_moe_tensors(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """Mamba 2's changes, and the stacked experts (`fc1` up, `fc2` down) named as the
    converter's merged `model.layers.N.mlp.experts`."""
    if ".switch_mlp.fc" in name:
        layer = name.split(".")[2]
        projection = "up" if ".fc1." in name else "down"
        yield f"blk.{layer}.ffn_{projection}_exps.weight", weight
        return
    yield from store_mamba2_tensors(name, weight, config)
