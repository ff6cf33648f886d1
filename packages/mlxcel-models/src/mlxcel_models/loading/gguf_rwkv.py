"""GGUF metadata and tensor layouts of RWKV-7.

llama.cpp's converter renames fla-hub's RWKV-7 parameters (its `blocks`/`attn`/`ffn` names,
the LoRA triples `w_lora.lora.{0,2}` as `w1`/`w2` with the bias as `w0`), squeezes every
tensor (the per-head `k_k`, `k_a`, `r_k` and group-norm weights become vectors, which the
loader reshapes back), stacks the six token-shift mixes `x_r … x_g` into one
`time_mix_lerp_fused` tensor, and gives layer 0 copies of its `a` LoRA as the value-residual
LoRA it does not have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx

from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_layouts import TensorJoin

# mlx-lm name fragment → the name the converter maps, in the order it renames them.
RWKV7_NAMES = (
    ("_lora.lora.0.weight", "1.weight"),
    ("_lora.lora.2.weight", "2.weight"),
    ("_lora.lora.2.bias", "0.weight"),
    ("ffn", "feed_forward"),
    ("attn", "attention"),
    ("feed_forward_norm", "ln2"),
    ("g_norm", "ln_x"),
)
# Vectors the converter made of per-head (heads, head size) parameters.
RWKV7_RESHAPED = frozenset({"time_mix_k_k", "time_mix_k_a", "time_mix_r_k", "time_mix_ln"})
# The value-residual LoRA of layer 0, which RWKV-7 does not have and llama.cpp needs.
RWKV7_PLACEHOLDERS = frozenset(f"blk.0.time_mix_v{part}.weight" for part in range(3))
_MIXES = ("r", "w", "k", "v", "a", "g")


def rwkv7(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """RWKV-7's head size and LoRA ranks."""
    return {
        "intermediate_size": meta.size("feed_forward_length"),
        "head_dim": meta.size("wkv.head_size"),
        "decay_low_rank_dim": meta.size("attention.decay_lora_rank"),
        "a_low_rank_dim": meta.size("attention.iclr_lora_rank"),
        "v_low_rank_dim": meta.size("attention.value_residual_mix_lora_rank"),
        "gate_low_rank_dim": meta.size("attention.gate_lora_rank"),
    }


def _token_shift_mixes(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array] | None:
    """The six token-shift mixes, (1, 1, hidden) each, from `time_mix_lerp_fused`."""
    fused = tensors["time_mix_lerp_fused.weight"].reshape(len(_MIXES), 1, 1, -1)
    return {f"attn.x_{mix}": fused[i] for i, mix in enumerate(_MIXES)}


RWKV7_TOKEN_SHIFT = TensorJoin(frozenset({"time_mix_lerp_fused.weight"}), _token_shift_mixes)
