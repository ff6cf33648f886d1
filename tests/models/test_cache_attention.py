"""mlx-lm attention inside a loaded model asks caches that compute attention, and runs
exactly as before for every other cache."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models import base, llama
from mlx_lm.models.cache import KVCache as MlxLmKVCache

from mlxcel_core.cache import AttentionCache, DenseKVCache
from mlxcel_models.additive_masks import create_additive_attention_mask
from mlxcel_models.cache_attention import cache_scaled_dot_product_attention
from mlxcel_models.loading.loader import load_model


class RecordingCache(DenseKVCache):
    """A dense cache whose attention is a constant, so its use shows in the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def attention(self, queries, keys, values, *, scale, mask):
        self.calls += 1
        return mx.zeros_like(queries)


def test_a_loaded_model_attends_through_caches_that_compute_attention(tiny_safetensors):
    model = load_model(tiny_safetensors).model
    assert llama.scaled_dot_product_attention is cache_scaled_dot_product_attention
    assert isinstance(RecordingCache(), AttentionCache)
    tokens = mx.array([[1, 2, 3]])
    recording = [RecordingCache() for _ in range(model.num_layers)]
    logits = model(tokens, recording)
    assert [cache.calls for cache in recording] == [1] * model.num_layers
    dense_logits = model(tokens, model.make_cache())
    assert not mx.allclose(logits, dense_logits)


def test_other_caches_get_mlx_lms_attention_unchanged(tiny_safetensors):
    load_model(tiny_safetensors)
    rng = mx.random.key(0)
    queries, keys, values = (mx.random.normal((1, 4, 3, 8), key=k) for k in mx.random.split(rng, 3))
    for cache in (None, MlxLmKVCache(), DenseKVCache()):
        ours = cache_scaled_dot_product_attention(
            queries, keys, values, cache=cache, scale=0.5, mask="causal"
        )
        theirs = base.scaled_dot_product_attention(
            queries, keys, values, cache=cache, scale=0.5, mask="causal"
        )
        assert mx.array_equal(ours, theirs)


def test_families_adding_their_mask_to_scores_get_it_as_scores_from_mlxcel_caches():
    h = mx.zeros((1, 3, 8), dtype=mx.bfloat16)
    cache = DenseKVCache()
    cache.update_and_fetch(mx.zeros((1, 1, 2, 4)), mx.zeros((1, 1, 2, 4)))
    allowed = base.create_attention_mask(h, cache, return_array=True)
    additive = create_additive_attention_mask(h, cache, return_array=True)
    assert additive.dtype == mx.bfloat16 and allowed.dtype == mx.bool_
    assert mx.array_equal(additive == 0, allowed).item()
    assert mx.all(mx.isinf(additive) == ~allowed).item()
    windowed = create_additive_attention_mask(h, cache, window_size=2, return_array=True)
    assert mx.array_equal(windowed == 0, cache.make_mask(3, window_size=2)).item()

    mlx_lm_cache = MlxLmKVCache()
    mlx_lm_cache.update_and_fetch(mx.zeros((1, 1, 2, 4)), mx.zeros((1, 1, 2, 4)))
    unchanged = create_additive_attention_mask(h, mlx_lm_cache, return_array=True)
    assert unchanged.dtype == mx.bool_
    assert create_additive_attention_mask(h, None, return_array=True).dtype == mx.bool_
    assert create_additive_attention_mask(h[:, :1], cache) is None
