"""Which entries pruning zeroes: masks over attention heads, MLP channels or whole layers.

A pruned query head loses its rows of q_proj and its columns of o_proj, so it adds
nothing to the residual stream. A key/value head is shared by a group of query heads
(grouped-query attention); its rows of k_proj and v_proj are zeroed only when every query
head of its group is pruned, so the heads kept see the same keys and values. A pruned MLP
channel loses its rows of gate_proj and up_proj and its column of down_proj. A pruned
layer keeps its norms but adds nothing to the residual stream: its o_proj and down_proj
(and their biases) are zeroed, so the layer passes its input through unchanged.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlxcel_models.surgery.errors import SurgeryError
from mlxcel_models.surgery.plan import PruneEdit, PruneTarget
from mlxcel_models.surgery.select import check_ranges
from mlxcel_models.surgery.tensors import ModelTensors

Masks = dict[str, mx.array]
"""Tensor name -> float32 mask (1 keeps, 0 zeroes) that broadcasts to the tensor."""


def prune_masks(
    edit: PruneEdit, tensors: ModelTensors, module: nn.Module, num_layers: int
) -> Masks:
    """The masks `edit` multiplies into the model's tensors.

    Args:
        edit: heads (query head indices), channels (MLP intermediate indices) or layers.
        tensors: the model's tensors (for names and shapes).
        module: the mlx-lm model (for each attention's `n_heads` and `n_kv_heads`).
        num_layers: decoder layers.

    Raises:
        SurgeryError: a layer, head or channel index is outside the model, or the model
            lacks the projections mlx-lm's llama-style families have.
    """
    check_ranges(edit.selection.layers, num_layers, "layers")
    layers = [i for i in range(num_layers) if edit.selection.includes_layer(i)]
    masks: Masks = {}
    for layer in layers:
        prefix = f"model.layers.{layer}."
        if edit.target is PruneTarget.LAYERS:
            for name in ("self_attn.o_proj", "mlp.down_proj"):
                masks.update(_zero(edit, tensors, prefix + name))
        elif edit.target is PruneTarget.HEADS:
            masks.update(_head_masks(edit, tensors, module.model.layers[layer].self_attn, prefix))
        else:
            masks.update(_channel_masks(edit, tensors, prefix))
    return masks


def _require(edit: PruneEdit, tensors: ModelTensors, name: str) -> tuple[int, ...]:
    if name not in tensors:
        raise SurgeryError(f"{edit.where}: cannot prune {edit.target.value}: no tensor {name}")
    return tensors.shape(name)


def _zero(edit: PruneEdit, tensors: ModelTensors, module_name: str) -> Masks:
    _require(edit, tensors, f"{module_name}.weight")
    names = [f"{module_name}.{part}" for part in ("weight", "bias")]
    return {name: mx.array(0.0) for name in names if name in tensors}


def _keep(size: int, dropped: list[int]) -> mx.array:
    keep = [1.0] * size
    for index in dropped:
        keep[index] = 0.0
    return mx.array(keep)


def _rows_and_bias(tensors: ModelTensors, module_name: str, keep: mx.array) -> Masks:
    masks = {f"{module_name}.weight": keep[:, None]}
    if f"{module_name}.bias" in tensors:
        masks[f"{module_name}.bias"] = keep
    return masks


def _head_masks(edit: PruneEdit, tensors: ModelTensors, attention: nn.Module, prefix: str) -> Masks:
    num_heads, num_kv_heads = attention.n_heads, attention.n_kv_heads
    check_ranges(edit.indices, num_heads, "heads")
    heads = sorted({h for r in edit.indices for h in range(r.first, r.last + 1)})
    rows, _ = _require(edit, tensors, prefix + "self_attn.q_proj.weight")
    head_dim = rows // num_heads
    group = num_heads // num_kv_heads
    kv_heads = [
        g for g in range(num_kv_heads) if set(range(g * group, (g + 1) * group)) <= set(heads)
    ]
    query = _keep(num_heads * head_dim, _head_entries(heads, head_dim))
    masks = _rows_and_bias(tensors, prefix + "self_attn.q_proj", query)
    _require(edit, tensors, prefix + "self_attn.o_proj.weight")
    masks[prefix + "self_attn.o_proj.weight"] = query
    if kv_heads:
        key_value = _keep(num_kv_heads * head_dim, _head_entries(kv_heads, head_dim))
        for name in ("self_attn.k_proj", "self_attn.v_proj"):
            _require(edit, tensors, f"{prefix}{name}.weight")
            masks.update(_rows_and_bias(tensors, prefix + name, key_value))
    return masks


def _head_entries(heads: list[int], head_dim: int) -> list[int]:
    return [h * head_dim + i for h in heads for i in range(head_dim)]


def _channel_masks(edit: PruneEdit, tensors: ModelTensors, prefix: str) -> Masks:
    channels, _ = _require(edit, tensors, prefix + "mlp.up_proj.weight")
    check_ranges(edit.indices, channels, "channels")
    dropped = sorted({c for r in edit.indices for c in range(r.first, r.last + 1)})
    keep = _keep(channels, dropped)
    masks: Masks = {}
    for name in ("mlp.gate_proj", "mlp.up_proj"):
        _require(edit, tensors, f"{prefix}{name}.weight")
        masks.update(_rows_and_bias(tensors, prefix + name, keep))
    _require(edit, tensors, prefix + "mlp.down_proj.weight")
    masks[prefix + "mlp.down_proj.weight"] = keep
    return masks
