"""Quantized KV cache types in the paged storage and through the engine.

The storage must keep the encoded components (so growth and copy-on-write move them
whole) and count their real bytes; on a tiny random llama with 32-feature heads, each
cache type must give the same tokens whether a sequence runs alone or is preempted,
reuses a cached prefix, or forks its prompt with copy-on-write.
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from test_batching_engine import (
    generate_all,
    make_config,
    make_prompts,
    make_request,
    running_engine,
    token_ids,
)

from mlxcel_core.cache.paged import BlockCopy, LayerGeometry, PagedKVStorage
from mlxcel_core.cache.quant import CacheTypeError, make_kv_codec
from mlxcel_core.engine import Engine, EngineConfig
from mlxcel_core.engine.config import plan_kv_blocks
from mlxcel_core.engine.memory import ModelProfile
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.loading.loader import load_model

from factories import TinyConfig, write_safetensors_model

BLOCK_SIZE = 4
GEOMETRY = LayerGeometry(num_kv_heads=2, key_dim=64, value_dim=64, dtype=mx.float32)
# (keys, values) pairs: llama.cpp's common mixes and each codec family.
ENGINE_TYPES = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("turbo3", "turbo3"), ("turbo4", "q8_0")]


def make_storage(cache_type_k: str, cache_type_v: str, max_blocks: int = 64) -> PagedKVStorage:
    return PagedKVStorage(
        [GEOMETRY, GEOMETRY],
        BLOCK_SIZE,
        max_blocks,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
    )


def random_kv(num: int, seed: int) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array(rng.standard_normal((num, 2, 64)).astype(np.float32))


# Storage


def test_storage_counts_the_encoded_bytes_of_each_type():
    auto = make_storage("auto", "auto")
    assert auto.bytes_per_block[0] == BLOCK_SIZE * 2 * 2 * (256 + 256)
    mixed = make_storage("turbo4", "q8_0")
    assert mixed.bytes_per_block[0] == BLOCK_SIZE * 2 * 2 * (37 + 68)
    assert GEOMETRY.bytes_per_token("turbo4", "q8_0") == 2 * (37 + 68)
    mixed.ensure_capacity(20)
    allocated = sum(a.nbytes for a in mixed.arrays())
    assert mixed.nbytes == allocated == mixed.capacity_blocks[0] * mixed.bytes_per_block[0]


@pytest.mark.parametrize(("cache_type_k", "cache_type_v"), [("q4_0", "turbo3"), ("f16", "bf16")])
def test_storage_gathers_what_the_codec_decodes_across_growth_and_block_copies(
    cache_type_k, cache_type_v
):
    storage = make_storage(cache_type_k, cache_type_v)
    storage.ensure_capacity(4)
    keys, values = random_kv(8, seed=1), random_kv(8, seed=2)
    slots = mx.arange(4, 12)  # blocks 1 and 2
    storage.write(1, slots, keys, values)
    storage.ensure_capacity(40)  # grows every component, keeping what was written
    storage.copy_blocks([BlockCopy(src_block_id=1, dst_block_id=30)])
    key_codec = make_kv_codec(cache_type_k, 64)
    value_codec = make_kv_codec(cache_type_v, 64)
    expected_keys = key_codec.decode(key_codec.encode(keys), mx.float32)
    expected_values = value_codec.decode(value_codec.encode(values), mx.float32)
    read = mx.array([[4, 5, 6, 7, 8, 9, 10, 11], [120, 121, 122, 123, 8, 9, 10, 11]])
    got_keys, got_values = storage.gather(1, read)
    assert got_keys.shape == (2, 2, 8, 64) and got_keys.dtype == mx.float32
    assert mx.array_equal(got_keys[0].transpose(1, 0, 2), expected_keys)
    # TurboQuant decodes through a product with its rotation, which a BLAS may round
    # differently over another number of rows.
    assert mx.allclose(got_values[0].transpose(1, 0, 2), expected_values, rtol=0, atol=1e-5)
    assert mx.array_equal(got_keys[1], got_keys[0])  # block 30 is block 1's copy
    assert not mx.array_equal(expected_keys, keys)  # the type really changed what is kept


def test_storage_refuses_a_head_dim_the_type_cannot_take():
    with pytest.raises(CacheTypeError, match=r"turbo3 needs .* power of two .*head_dim=96"):
        PagedKVStorage([LayerGeometry(2, 96, 96, mx.float16)], BLOCK_SIZE, 8, cache_type_k="turbo3")
    with pytest.raises(ValueError, match="cache_type_v must be one of auto, f32"):
        make_storage("auto", "int8")


def test_planned_blocks_grow_as_the_cache_type_shrinks():
    profile = ModelProfile(
        layers=(GEOMETRY,) * 4, resident_bytes=0, transient_bytes=0, vocab_size=64
    )

    def blocks(**types) -> int:
        # Without the residual window's exact copies, whose bytes come off the budget.
        config = EngineConfig(
            context_size=16, block_size=BLOCK_SIZE, device_memory=2**20, cache_residual=0, **types
        )
        return plan_kv_blocks(config, profile)

    def fitting(vector_bytes: int) -> int:
        # 4 layers of 2 heads, keys and values: usable bytes over one block's.
        return int(2**20 * 0.9) // (BLOCK_SIZE * 4 * 2 * 2 * vector_bytes)

    assert blocks() == fitting(256)
    assert blocks(cache_type_k="f16", cache_type_v="f16") == fitting(128)
    assert blocks(cache_type_k="turbo4", cache_type_v="turbo4") == fitting(37)
    assert blocks(cache_type_k="turbo4", cache_type_v="turbo4") > 6 * blocks()
    # A draft model's KV shares each block, stored in its own dtype whatever the types.
    config = EngineConfig(
        context_size=16,
        block_size=BLOCK_SIZE,
        device_memory=2**20,
        cache_type_k="turbo4",
        cache_type_v="turbo4",
        cache_residual=0,
    )
    assert plan_kv_blocks(config, profile, draft=profile) == fitting(37 + 256)


def test_engine_config_rejects_unknown_cache_types():
    with pytest.raises(ValueError, match=r"cache_type_k must be one of .*turbo4; got 'q2_k'"):
        EngineConfig(cache_type_k="q2_k")


# Through the engine


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> LanguageModel:
    """A tiny llama with 32-feature heads, which q8_0 and q4_0 need."""
    config = TinyConfig(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)
    folder = write_safetensors_model(tmp_path_factory.mktemp("hd32") / "llama", config)
    return load_model(folder).model


def typed_config(types: tuple[str, str], **kwargs) -> EngineConfig:
    return make_config(cache_type_k=types[0], cache_type_v=types[1], **kwargs)


def alone(model: LanguageModel, types: tuple[str, str], requests) -> list[list[int]]:
    """Each request on its own, on a roomy engine without prefix caching."""
    with running_engine(model, typed_config(types, enable_prefix_caching=False)) as engine:
        return [token_ids(generate_all(engine, [replace(r, index=0)])[0]) for r in requests]


def test_quantized_types_change_the_tokens_a_random_model_picks(model):
    """Guards the tests below: the cache type is really in effect in the engine."""
    requests = [make_request(p) for p in make_prompts()]
    assert alone(model, ("turbo2", "turbo2"), requests) != alone(model, ("auto", "auto"), requests)


@pytest.mark.parametrize("types", ENGINE_TYPES, ids="/".join)
def test_preemption_gives_each_type_the_tokens_it_gives_alone(model, types):
    requests = [make_request(p, index=i) for i, p in enumerate(make_prompts())]
    expected = alone(model, types, requests)
    with running_engine(model, typed_config(types, num_kv_blocks=14)) as engine:
        outputs = generate_all(engine, requests)
        assert engine.stats.num_preemptions > 0
    assert [token_ids(o) for o in outputs] == expected


@pytest.mark.parametrize("types", ENGINE_TYPES, ids="/".join)
def test_prefix_hits_and_copy_on_write_forks_give_each_type_its_tokens_alone(model, types):
    prompt = make_prompts([10])[0]  # blocks of 4: the third block is shared, then written
    samplings = [SamplingParams(temperature=0.9, seed=seed) for seed in (7, 8, 9)]
    forks = [make_request(prompt, index=i, sampling=s) for i, s in enumerate(samplings)]
    expected = alone(model, types, [make_request(prompt), *forks])
    with running_engine(model, typed_config(types)) as engine:
        (first,) = generate_all(engine, [make_request(prompt)])
        (again,) = generate_all(engine, [make_request(prompt)])
        forked = generate_all(engine, forks)
    assert again[-1].stats.cached_tokens == 8
    assert token_ids(first) == token_ids(again) == expected[0]
    assert [token_ids(o) for o in forked] == expected[1:]
    assert len({tuple(ids) for ids in expected[1:]}) == 3


def test_an_engine_on_a_head_dim_the_type_cannot_take_fails_to_start(tiny_safetensors):
    tiny = load_model(tiny_safetensors).model  # 16-feature heads
    with pytest.raises(CacheTypeError, match=r"q8_0 needs .*multiple of 32.*head_dim=16"):
        Engine(tiny, make_config(cache_type_k="q8_0"))
