"""PLaMo 2 in GGUF files (`plamo2`): Mamba layers between attention layers, under PLaMo's
own parameter names.

llama.cpp's converter writes the layer pattern (mlx-lm's `mamba_step`) as per-layer head
counts, 0 on a Mamba layer; the Mamba sizes as `ssm.*` keys (the head count as
`ssm.time_step_rank`); the decay as `A = -exp(A_log)`, the depthwise kernel squeezed to
(channels, width), and each norm with the offset PLaMo adds at run time already added.
The fused projections (`in_proj`, `bcdt_proj`, `qkv_proj`, `gate_up_proj`) stay whole.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_hybrid import attention_layers
from mlxcel_models.loading.gguf_recurrent import restore_ssm_decay

# mlx-lm's PLaMo 2 attention rotates with nn.RoPE's default base.
_PLAMO2_ROPE_BASE = 10000.0
# The offsets PLaMo 2's norms add at run time, which the converter adds to the stored
# weights (by GGUF name); its Q/K norms and the Mamba dt/B/C norms have none.
_NORM_OFFSETS = {
    "attn_norm": 1.0,
    "post_attention_norm": 1.0 / 5,
    "ffn_norm": 1.0,
    "post_ffw_norm": 1.0 / 5**1.5,
    "output_norm": 1.0,
}


def _is_mamba(layer: int, num_layers: int, step: int) -> bool:
    """PLaMo 2's placement of its Mamba layers (`modeling_plamo.is_mamba`)."""
    if num_layers <= step // 2:
        return layer != num_layers - 1
    return layer % step != step // 2


def _mamba_step(attention: list[bool], meta: GGUFMetadata) -> int:
    """The `mamba_step` whose pattern puts attention exactly on `attention`'s layers.

    Raises:
        ModelLoadError: no step gives the file's layers.
    """
    num_layers = len(attention)
    for step in range(2, 2 * num_layers + 1):
        if all(_is_mamba(i, num_layers, step) != a for i, a in enumerate(attention)):
            return step
    layers = [i for i, a in enumerate(attention) if a]
    raise ModelLoadError(
        f"{meta.where}: PLaMo 2's attention layers repeat every mamba_step layers; "
        f"the file's attention layers {layers} do not"
    )


def plamo2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """PLaMo 2's layer pattern and Mamba sizes.

    Raises:
        ModelLoadError: no layer pattern PLaMo 2 places, a Mamba inner size other than
            heads times head size, or a RoPE base other than the 10000 mlx-lm's PLaMo 2 uses.
    """
    attention = attention_layers(meta)
    head_dim = config["head_dim"]
    heads = meta.size("ssm.time_step_rank")
    inner = meta.size("ssm.inner_size")
    if inner != heads * head_dim:
        raise ModelLoadError(
            f"{meta.where}: plamo2.ssm.inner_size ({inner}) must be ssm.time_step_rank "
            f"({heads}) times attention.key_length ({head_dim})"
        )
    if config["rope_theta"] != _PLAMO2_ROPE_BASE:
        raise ModelLoadError(
            f"{meta.where}: plamo2.rope.freq_base is {config['rope_theta']}; mlx-lm's "
            f"PLaMo 2 rotates with base {_PLAMO2_ROPE_BASE:g}"
        )
    mamba_enabled = not all(attention)
    return {
        "hidden_size_per_head": head_dim,
        "mamba_enabled": mamba_enabled,
        "mamba_step": _mamba_step(attention, meta) if mamba_enabled else 2,
        "mamba_num_heads": heads,
        "mamba_d_state": meta.size("ssm.state_size"),
        "mamba_d_conv": meta.size("ssm.conv_kernel"),
    }


def restore_plamo2_tensor(
    base: str, arrays: dict[str, mx.array], config: dict[str, Any]
) -> dict[str, mx.array]:
    """`A_log` back from the stored decay, and each norm's run-time offset taken off."""
    if base == "ssm_a":
        return restore_ssm_decay(base, arrays, config)
    offset = _NORM_OFFSETS.get(base)
    if offset is None:
        return arrays
    weight = arrays["weight"]
    return {"weight": (weight.astype(mx.float32) - offset).astype(weight.dtype)}
