"""Let caches that compute attention (`AttentionCache`) do so inside mlx-lm's model classes.

mlx-lm's attention modules call `scaled_dot_product_attention(queries, keys, values,
cache=..., scale=..., mask=...)`, a name each family's module imports from
`mlx_lm.models.base`. `route_attention_through_caches` rebinds that name, in the modules
of the families a model uses, to a function that hands the call to the cache when the
cache is an `AttentionCache` and to mlx-lm's own function otherwise, so mlx-lm's caches
and every other user of those modules see no change. The cache declines (and mlx-lm's
function attends) where the model passes keys or values other than those the cache
returned: multi-head latent attention (DeepSeek V2/V3, Kimi, GLM-4-MoE-Lite, MiniCPM3)
stores its compressed latent and attends over projections of it. A layer without a cache
that attends over keys and values a paged layer cache returned as the new positions alone
(Gemma 4's KV-shared layers) attends through that cache, which holds their context.
"""

from __future__ import annotations

import functools
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base

from mlxcel_core.cache import AttentionCache, AttentionMask
from mlxcel_core.cache.paged.layer_cache import deferred_context_owner

_MLX_LM_ATTENTION = base.scaled_dot_product_attention


def cache_scaled_dot_product_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    cache: object,
    scale: float,
    mask: AttentionMask,
    sinks: mx.array | None = None,
) -> mx.array:
    """mlx-lm's `scaled_dot_product_attention`, computed by the cache when it can.

    Args and result as `mlx_lm.models.base.scaled_dot_product_attention`; attention with
    sinks always goes to mlx-lm's function.
    """
    if cache is None:
        cache = deferred_context_owner(keys, values)
    if sinks is None and _computes_attention(type(cache)):
        attended = cache.attention(queries, keys, values, scale=scale, mask=mask)
        if attended is not None:
            return attended
    return _MLX_LM_ATTENTION(queries, keys, values, cache, scale, mask, sinks)


@functools.cache
def _computes_attention(cache_type: type) -> bool:
    # Once per type: a runtime protocol's isinstance check walks its members at every
    # call, some microseconds in every layer of every step.
    return issubclass(cache_type, AttentionCache)


def route_attention_through_caches(module: nn.Module) -> None:
    """Rebind `scaled_dot_product_attention` to `cache_scaled_dot_product_attention` in
    the Python module of every submodule class of `module` that imports mlx-lm's."""
    for name in {type(layer).__module__ for _, layer in module.named_modules()}:
        namespace = vars(sys.modules[name])
        if namespace.get("scaled_dot_product_attention") is _MLX_LM_ATTENTION:
            namespace["scaled_dot_product_attention"] = cache_scaled_dot_product_attention
