"""Tiny mixture-of-experts mlx-lm families whose experts llama.cpp's converter lays out
differently from mlx-lm, written as the converter writes them."""

from __future__ import annotations

import numpy as np

from gguf_models import ConvertedFamily, tiny_config

_DBRX_EXPERTS = (("w1", "ffn_gate_exps"), ("v1", "ffn_up_exps"), ("w2", "ffn_down_exps"))


def stack_dbrx_experts(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each layer's experts stacked: gate (`w1`) and up (`v1`) as (experts, ffn, hidden),
    down (`w2`) as (experts, hidden, ffn), as the converter writes DBRX's `experts.mlp`."""
    merged = {name: weight for name, weight in weights.items() if ".ffn.experts." not in name}
    layers = sorted({int(name.split(".")[2]) for name in weights if ".ffn.experts." in name})
    for layer in layers:
        prefix = f"transformer.blocks.{layer}.ffn.experts"
        count = len({name for name in weights if name.startswith(f"{prefix}.")}) // 3
        for projection, gguf_name in _DBRX_EXPERTS:
            experts = [weights[f"{prefix}.{e}.{projection}.weight"] for e in range(count)]
            merged[f"blk.{layer}.{gguf_name}.weight"] = np.stack(experts)
    return merged


EXPERT_FAMILIES = {
    "dbrx": ConvertedFamily(
        "dbrx",
        tiny_config(
            "dbrx",
            d_model=64,
            n_layers=2,
            n_heads=4,
            intermediate_size=32,
            ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
            attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
        ),
        {
            "layer_norm_eps": 1e-5,
            "clamp_kqv": 8.0,
            "expert_count": 4,
            "expert_used_count": 2,
        },
        merge_tensors=stack_dbrx_experts,
    ),
}
