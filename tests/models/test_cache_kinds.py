"""mlx-lm's cache classes read as mlxcel cache kinds, and the engine's caches handed back."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from mlxcel_core.cache import DenseKVCache
from mlxcel_core.cache.layout import CacheLayout, LayerCacheKind
from mlxcel_core.cache.state import (
    CompositeCache,
    SlotStateCache,
    StateArrayGeometry,
    StatePool,
    state_bytes_per_sequence,
)
from mlxcel_core.engine.memory import profile_model
from mlxcel_models.cache_kinds import (
    UnsupportedCacheError,
    mlx_lm_cache_layout,
    mlx_lm_caches,
)
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.detection import ModelSource
from mlxcel_models.memory import (
    Architecture,
    ContextRequest,
    ModelInventory,
    estimate_memory,
    kv_cache_bytes,
    kv_group_bytes_per_token,
    kv_layers,
    sequences_kv_bytes,
)
from mlxcel_models.memory.estimate import cache_geometry
from mlxcel_models.metadata import FamilyMetadata, ModelKind, WeightFormat

from cache_kind_models import CONFIGS, make_model

ATTENTION = LayerCacheKind.attention()


class _Module:
    """What `mlx_lm_cache_layout` reads of an mlx-lm model: its `make_cache`."""

    def __init__(self, *caches: object) -> None:
        self._caches = caches

    def make_cache(self) -> list[object]:
        return list(self._caches)


def test_each_mlx_lm_cache_class_maps_to_its_kind():
    module = _Module(
        KVCache(),
        RotatingKVCache(max_size=512),
        ChunkedKVCache(chunk_size=8),
        ArraysCache(size=2),
        CacheList(ArraysCache(size=2), KVCache()),
        CacheList(KVCache()),
    )
    shape = mlx_lm_caches(module)
    assert shape.layout == CacheLayout.of(
        [
            [ATTENTION],
            [LayerCacheKind.sliding_window(512)],
            [LayerCacheKind.chunked(8)],
            [LayerCacheKind.state(2)],
            [LayerCacheKind.state(2), ATTENTION],
            [ATTENTION],
        ]
    )
    assert shape.lists == {4, 5} and not shape.fit_as_they_are


@pytest.mark.parametrize(
    ("cache", "match"),
    [
        (QuantizedKVCache(), "layer 0 keeps a QuantizedKVCache"),
        (RotatingKVCache(max_size=8, keep=4), "keeps its first 4 positions"),
        (CacheList(CacheList(KVCache())), "nests a CacheList"),
    ],
)
def test_caches_with_no_kind_are_refused_by_name(cache, match):
    with pytest.raises(UnsupportedCacheError, match=match):
        mlx_lm_cache_layout(_Module(cache))


def test_the_engines_state_caches_reach_mlx_lm_as_arrays_caches():
    pool = StatePool([(StateArrayGeometry((2,), mx.float32),)], num_slots=2)
    state = SlotStateCache(pool, 0, mx.array([1]), fresh=True)
    attention = DenseKVCache()
    shape = mlx_lm_caches(_Module(KVCache(), CacheList(ArraysCache(size=1), KVCache())))
    plain, composite = shape.as_mlx_lm([attention, CompositeCache([state, attention])])
    assert plain is attention
    assert isinstance(composite, CacheList)
    arrays = composite[0]
    assert isinstance(arrays, ArraysCache)  # Mamba writes its state only into one
    assert arrays[0] is None and arrays.lengths is None and arrays.make_mask(3) is None
    arrays[0] = mx.ones((1, 2))
    assert state[0] is arrays[0]
    assert list(arrays) == [arrays[0]]  # unpacked by its array count (Kimi Linear)
    arrays.advance(3)


def test_listed_attention_parts_show_what_they_returned_and_chunks_keep_their_front():
    """An indexer reads `keys`/`values` off its `CacheList` part (DeepSeek V3.2); Llama 4
    trims its chunked caches' front and builds its mask from `start_position`."""
    shape = mlx_lm_caches(_Module(CacheList(KVCache(), KVCache()), ChunkedKVCache(4)))
    indexed, chunked = DenseKVCache(), DenseKVCache()
    layer, chunk = shape.as_mlx_lm([CompositeCache([DenseKVCache(), indexed]), chunked])
    keys = mx.ones((1, 1, 6, 8))
    returned, _ = layer[1].update_and_fetch(keys, keys)
    assert layer[1].keys is returned and indexed.offset == 6
    chunk.update_and_fetch(keys, keys)
    chunk.maybe_trim_front()
    assert chunk.start_position == 0 and chunk.offset == 6
    native = make_prompt_cache(_Module(KVCache()))
    assert shape.as_mlx_lm([native[0], native[0]])[0] is native[0]


def inventory_of(name: str) -> ModelInventory:
    """An inventory of a tiny model of `cache_kind_models`, as its headers would give it."""
    config = CONFIGS[name]
    heads = config.get("num_attention_heads", 4)
    architecture = Architecture(
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or config.get("num_attention_groups", 2),
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        vocab_size=config["vocab_size"],
        context_length=256,
    )
    family = FamilyMetadata(name, ModelKind.TEXT, frozenset(WeightFormat), False)
    source = ModelSource(Path(name), WeightFormat.SAFETENSORS, name)
    return ModelInventory(source, family, architecture, (), 0, (mx.float32,), config)


def test_the_estimate_counts_a_hybrid_models_attention_layers_and_state_slots():
    """Jamba's estimate from its config equals what the engine's profiling pass records:
    two attention layers' keys and values, and two Mamba layers' state per sequence."""
    options = ComputeOptions(float_dtype=mx.float32)
    geometry = cache_geometry(inventory_of("jamba"), options)
    profile = profile_model(make_model("jamba"), 4)
    assert geometry.layers == profile.layers
    assert geometry.state_layers == profile.state_layers
    estimate = estimate_memory(inventory_of("jamba"), ContextRequest(64), options)
    assert estimate.states == state_bytes_per_sequence(profile.state_layers) > 0
    per_token = sum(layer.bytes_per_token() for layer in profile.layers)
    assert estimate.kv_cache == (64 // 16 + 1) * 16 * per_token


def test_the_estimate_of_an_all_windowed_model_holds_its_window_and_a_chunk():
    options = ComputeOptions(float_dtype=mx.float32)
    request = ContextRequest(4096, chunk_tokens=64, block_size=16)
    estimate = estimate_memory(inventory_of("step3p5"), request, options)
    # Window 8: 7 positions back, a chunk of 64, and the two blocks they start inside of.
    per_token = sum(
        layer.bytes_per_token() for layer in kv_layers(inventory_of("step3p5"), options)
    )
    assert estimate.kv_cache == kv_cache_bytes(per_token, 7 + 64 + 32, 16)
    assert estimate.states == 0


@pytest.mark.parametrize("name", ["gemma3_text", "gpt_oss"])
def test_the_estimate_of_mixed_layers_holds_a_window_for_the_windowed_ones(name):
    """Two layers read every position, two a window of 8: those hold the window and a
    chunk only, in a block group of their own."""
    options = ComputeOptions(float_dtype=mx.float32)
    request = ContextRequest(4096, chunk_tokens=64, block_size=16)
    inventory = inventory_of(name)
    layers = kv_layers(inventory, options)
    assert len(layers) == 4
    full = sum(layer.bytes_per_token() for layer in layers[1::2])
    windowed = sum(layer.bytes_per_token() for layer in layers[0::2])
    estimate = estimate_memory(inventory, request, options)
    assert estimate.kv_cache == kv_cache_bytes(full, 4096, 16) + kv_cache_bytes(
        windowed, 7 + 64 + 32, 16
    )
    geometry = cache_geometry(inventory, options)
    assert kv_group_bytes_per_token(geometry, "auto", "auto") == [(None, full), (8, windowed)]
    four = sequences_kv_bytes(
        geometry, request, 4096, cache_type_k="auto", cache_type_v="auto", num_sequences=4
    )
    assert four == kv_cache_bytes(full, 4096, 16, 4) + kv_cache_bytes(windowed, 103, 16, 4)
