"""Attention masks as additive scores, for mlx-lm families that add their mask to scores.

phi3small's block-sparse layers add the mask `create_attention_mask(h, cache,
return_array=True)` gives them to their attention scores. mlx-lm's mask is boolean, so
the addition gives an allowed key +1 and a masked one 0, masking nothing: a query of a
multi-token pass attends to the later positions of its pass that share its sparse block,
and mlx-lm's tokens depend on how a prompt is cut into passes (with one token per pass,
where mlx-lm makes no mask, the model is causal, as Phi-3-small is meant to be).

`route_additive_masks` rebinds `create_attention_mask` in those families' modules to a
function that gives mlxcel's caches the same mask as scores, 0 where a key is allowed
and -inf where not, which the block-sparse layers' addition and the dense layers'
`scaled_dot_product_attention` both apply as a mask, so the model is causal however the
engine cuts its prompts. mlx-lm's own caches (and a call without a cache) get mlx-lm's
mask unchanged, so every other user of those modules sees no change.
"""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base
from mlx_lm.models.cache import _BaseCache

from mlxcel_core.cache import AttentionMask

_MLX_LM_CREATE_ATTENTION_MASK = base.create_attention_mask

ADDITIVE_MASK_MODULES = {
    "mlx_lm.models.phi3small": "its block-sparse layers add the mask to their scores",
}
"""mlx-lm modules whose models add the attention mask to their scores, with the reason."""


def create_additive_attention_mask(
    h: mx.array,
    cache: object = None,
    window_size: int | None = None,
    return_array: bool = False,
) -> AttentionMask:
    """mlx-lm's `create_attention_mask`, a boolean mask for an mlxcel cache given as
    scores to add: 0 where a key is allowed, -inf where not, in `h`'s dtype.

    Args and result as `mlx_lm.models.base.create_attention_mask`.
    """
    mask = _MLX_LM_CREATE_ATTENTION_MASK(
        h, cache, window_size=window_size, return_array=return_array
    )
    if cache is None or isinstance(cache, _BaseCache):
        return mask
    if not isinstance(mask, mx.array) or mask.dtype != mx.bool_:
        return mask
    return mx.where(mask, mx.array(0, h.dtype), mx.array(-mx.inf, h.dtype))


def route_additive_masks(module: nn.Module) -> None:
    """Rebind `create_attention_mask` to `create_additive_attention_mask` in the Python
    module of every submodule class of `module` listed in `ADDITIVE_MASK_MODULES`."""
    for name in {type(layer).__module__ for _, layer in module.named_modules()}:
        namespace = vars(sys.modules[name])
        if (
            name in ADDITIVE_MASK_MODULES
            and namespace.get("create_attention_mask") is _MLX_LM_CREATE_ATTENTION_MASK
        ):
            namespace["create_attention_mask"] = create_additive_attention_mask
