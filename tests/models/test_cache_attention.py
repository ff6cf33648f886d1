"""mlx-lm attention inside a loaded model asks caches that compute attention, and runs
exactly as before for every other cache."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models import base, llama
from mlx_lm.models.cache import KVCache as MlxLmKVCache

from mlxcel_core.cache import AttentionCache, DenseKVCache
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
