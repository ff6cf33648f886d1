"""The engine on models that mix sliding-window and full-attention layers (Gemma 3, gpt-oss).

The windowed layers keep their keys and values in a block group of their own, which frees
each sequence's blocks behind the window; the full-attention layers keep every block. On
tiny random-weight models (`cache_kind_models`) greedy tokens through the engine must
equal mlx-lm's `generate_step` (with its `RotatingKVCache`s) however the window group is
used: with a warm prefix cache (hits both groups serve), with speculative decoding, with
quantized KV types and a residual window; the window group's blocks must return to its
pool, and the memory plan must size each group.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from test_batching_engine import generate_all, make_request, running_engine, token_ids
from test_cache_kinds_engine import (
    BLOCK_SIZE,
    CONTEXT_SIZE,
    GENERATION,
    MIXED_FAMILIES,
    NUM_TOKENS,
    BlockWatch,
    make_config,
    make_prompts,
    mlx_lm_greedy,
)
from test_engine import drain

from mlxcel_core.cache import KVCache
from mlxcel_core.cache.block_groups import BlockGroups
from mlxcel_core.cache.layout import CacheLayout
from mlxcel_core.engine import InsufficientMemoryError, SchedulerConfig
from mlxcel_core.engine.config import plan_kv_blocks
from mlxcel_core.engine.kv_plan import plan_kv_cache
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.request import GenerationConfig
from mlxcel_core.speculative import SpeculativeConfig, SpeculativeMethod
from mlxcel_models.language_model import MlxLmLanguageModel

from cache_kind_models import WINDOW, make_model

ONE_TOKEN = GenerationConfig(context_size=CONTEXT_SIZE, max_tokens=1)


@pytest.fixture(scope="module", params=MIXED_FAMILIES)
def family(request) -> tuple[str, MlxLmLanguageModel]:
    return request.param, make_model(request.param)


def test_windowed_layers_get_a_block_group_of_their_own(family):
    _, model = family
    groups = BlockGroups.of([model.cache_layout])
    assert groups.windows == (None, WINDOW)
    # Windowed, full, windowed, full.
    assert groups.layer_groups(model.cache_layout) == (1, 0, 1, 0)


class GroupWatch(BlockWatch):
    """A sink that notes the blocks in use in each group at each output."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.group_blocks_used: list[tuple[int, ...]] = []

    def put(self, output) -> None:
        self.group_blocks_used.append(tuple(g.num_used for g in self.engine.stats.kv_groups))
        super().put(output)


def test_the_window_groups_blocks_return_to_its_pool(family, async_scheduling):
    name, model = family
    prompt = make_prompts([17])[0]
    with running_engine(model, make_config(async_scheduling=async_scheduling)) as engine:
        watch = GroupWatch(engine)
        engine.submit([make_request(prompt, generation=GENERATION)], watch)
        outputs = drain(watch.queue, 1)
        groups = engine.stats.kv_groups
    assert token_ids(outputs) == mlx_lm_greedy(model, prompt), name
    # The KV of 17 + 31 positions (the last token's is never computed) fills 12 blocks of
    # 4: the full group holds them all, the window group its first block, the window of 8
    # before the newest token and that token's.
    assert max(full for full, _ in watch.group_blocks_used) == 12
    assert max(windowed for _, windowed in watch.group_blocks_used) <= 5
    # Every block is back in its pool: 63 usable in the full group; in the window group,
    # each of the 4 running sequences' window and chunk (6 blocks), and its null block.
    assert [(g.window, g.num_blocks, g.num_used) for g in groups] == [
        (None, 63, 0),
        (WINDOW, 4 * 6, 0),
    ]


def test_a_warm_prefix_cache_hits_what_both_groups_hold(family, async_scheduling):
    """A 30-token prompt run once leaves its blocks cached in both groups (the window
    group's freed behind the window as it went). Run again beside a prompt sharing its
    first 20 tokens and one of another length, each hits the longest prefix both groups
    serve, and every output is mlx-lm's."""
    name, model = family
    prompt = make_prompts([30])[0]
    sharing = (*prompt[:20], *make_prompts([1, 11])[1])
    other = make_prompts([1, 1, 9])[2]
    with running_engine(model, make_config(async_scheduling=async_scheduling)) as engine:
        generate_all(engine, [make_request(prompt, generation=ONE_TOKEN)])
        outputs = generate_all(
            engine,
            [
                make_request(p, index=i, generation=GENERATION)
                for i, p in enumerate([prompt, sharing, other])
            ],
        )
    assert [token_ids(o) for o in outputs] == [
        mlx_lm_greedy(model, p) for p in (prompt, sharing, other)
    ], name
    # 7 full blocks before the prompt's last token; 5 shared blocks; none.
    assert [o[-1].stats.cached_tokens for o in outputs] == [28, 20, 0]


def test_a_hit_stops_where_the_window_group_no_longer_holds_the_blocks(family, async_scheduling):
    """With one sequence at a time the window group has 6 blocks: a second run of a
    30-token prompt still hits the blocks its window reads, but once another prompt has
    taken the window group's blocks, the full group's cached blocks alone make no hit."""
    name, model = family
    prompt, other = make_prompts([30, 30])
    config = make_config(
        async_scheduling=async_scheduling,
        scheduler=SchedulerConfig(max_num_seqs=1, max_prefill_chunk=8),
    )
    with running_engine(model, config) as engine:
        generate_all(engine, [make_request(prompt, generation=ONE_TOKEN)])
        (again,) = generate_all(engine, [make_request(prompt, generation=GENERATION)])
        generate_all(engine, [make_request(other, generation=ONE_TOKEN)])
        (evicted,) = generate_all(engine, [make_request(prompt, generation=GENERATION)])
        full, windowed = engine.stats.kv_groups
    assert windowed.num_blocks == 6
    expected = mlx_lm_greedy(model, prompt)
    assert token_ids(again) == token_ids(evicted) == expected, name
    assert again[-1].stats.cached_tokens == 28
    assert evicted[-1].stats.cached_tokens < 28
    # The full group still holds every block of both prompts.
    assert full.num_cached >= 2 * 7


@pytest.mark.parametrize("method", [SpeculativeMethod.PROMPT_LOOKUP, SpeculativeMethod.DRAFT_MODEL])
def test_speculative_decoding_keeps_greedy_outputs(family, method):
    """Drafts verified through both groups, the window group freeing as accepted tokens
    move each sequence on; the model drafts for itself, so its drafts are mostly taken."""
    name, model = family
    spec = SpeculativeConfig(method=method, num_draft_tokens=3, draft_p_min=0.0)
    prompts = make_prompts([5, 11, 17])
    draft = model if method is SpeculativeMethod.DRAFT_MODEL else None
    with running_engine(model, make_config(speculative=spec), draft) as engine:
        outputs = generate_all(
            engine,
            [make_request(p, index=i, generation=GENERATION) for i, p in enumerate(prompts)],
        )
    assert [token_ids(o) for o in outputs] == [mlx_lm_greedy(model, p) for p in prompts], name
    if draft is not None:
        accepted = sum(o[-1].stats.accepted_draft_tokens for o in outputs)
        assert accepted > NUM_TOKENS


class OneGroup:
    """A model whose layers all claim full attention: the engine keeps one block group,
    every block, and windows only through the layers' masks (as before block groups)."""

    def __init__(self, model: MlxLmLanguageModel) -> None:
        self.model = model

    @property
    def cache_layout(self) -> CacheLayout:
        return CacheLayout.all_attention(len(self.model.cache_layout.layers))

    def make_cache(self) -> list[KVCache]:
        return self.model.make_cache()

    def __call__(self, tokens: mx.array, cache, *, last_only=False):
        return self.model(tokens, cache, last_only=last_only)


@pytest.mark.parametrize(("cache_type", "residual"), [("turbo3", 0), ("turbo4", 6)])
def test_quantized_kv_in_a_window_group_gives_the_tokens_of_one_group(
    family, cache_type, residual, async_scheduling
):
    """Quantized keys and values (TurboQuant's centered on each sequence's first block,
    which the window group keeps) and a residual window of exact copies, per group."""
    name, model = family
    prompts = make_prompts([5, 11, 17])
    config = make_config(
        async_scheduling=async_scheduling,
        cache_type_k=cache_type,
        cache_type_v=cache_type,
        cache_residual=residual,
    )
    results = []
    for runner_model in (model, OneGroup(model)):
        with running_engine(runner_model, config) as engine:
            outputs = generate_all(
                engine,
                [make_request(p, index=i, generation=GENERATION) for i, p in enumerate(prompts)],
            )
            results.append(([token_ids(o) for o in outputs], len(engine.stats.kv_groups)))
    (grouped, num_groups), (single, num_single) = results
    assert (num_groups, num_single) == (2, 1)
    assert grouped == single, name


def test_the_memory_plan_sizes_each_group(family):
    """The window group gets room for every running sequence's window and chunk, the full
    group the rest: more full-attention blocks than one group of all layers would get."""
    _, model = family
    profile = profile_model(model, 4)
    # What the process already holds (other tests' arrays included) plus 64 MiB of room.
    memory = profile.resident_bytes + profile.transient_bytes + 2**26
    config = make_config(num_kv_blocks=None, device_memory=memory, memory_utilization=1.0)
    plan = plan_kv_cache(config, profile, model.cache_layout)
    assert plan.groups.windows == (None, WINDOW)
    per_sequence = config.blocks_per_sequence(WINDOW)
    assert plan.num_blocks[1] == config.scheduler.max_num_seqs * per_sequence + 1
    free = 2**26
    block_bytes = [
        BLOCK_SIZE * sum(layer.bytes_per_token() for layer in profile.layers[group::2])
        for group in (1, 0)
    ]
    assert plan.num_blocks[0] == (free - plan.num_blocks[1] * block_bytes[1]) // block_bytes[0]
    assert plan.num_blocks[0] > plan_kv_blocks(config, profile)


def test_a_plan_with_no_room_names_the_group_short_of_it(family):
    _, model = family
    profile = profile_model(model, 4)
    block_bytes = BLOCK_SIZE * sum(layer.bytes_per_token() for layer in profile.layers)
    # Room for 10 blocks of every layer: enough for one sequence's window (7 blocks) in
    # the window group, not for one of 64 tokens (16 blocks) in the full group.
    memory = profile.resident_bytes + profile.transient_bytes + 10 * block_bytes
    config = make_config(num_kv_blocks=None, device_memory=memory, memory_utilization=1.0)
    with pytest.raises(InsufficientMemoryError, match="in its full-attention layers"):
        plan_kv_cache(config, profile, model.cache_layout)
    # With a fixed count the window group gets what its sequences can hold, at most.
    fixed = make_config(num_kv_blocks=40)
    assert plan_kv_cache(fixed, profile, model.cache_layout).num_blocks == (40, 4 * 6 + 1)
    assert plan_kv_cache(make_config(num_kv_blocks=20), profile, model.cache_layout).num_blocks == (
        20,
        20,
    )
