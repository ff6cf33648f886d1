"""The engine on models whose layers keep recurrent states, several caches, or windows.

Tiny random-weight mlx-lm models of each kind (`cache_kind_models`): greedy tokens through
mlxcel's engine must equal mlx-lm's own `generate_step` (its `ArraysCache`s,
`RotatingKVCache`s and `CacheList`s) for every prompt, run alone, batched with prompts of
other lengths (prefill chunks of different lengths in one step, decode rows together),
under preemption, and forked into several choices; blocks behind a window return to the
pool; prefix caching is off where a state cannot be shared and right where a window is.
Models that mix windowed and full-attention layers (Gemma 3, gpt-oss) run the same tests;
what their windowed layers' block group does is tested in `test_window_groups_engine`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from test_batching_engine import (
    generate_all,
    generate_alone,
    make_request,
    running_engine,
    token_ids,
)
from test_engine import drain

from mlxcel_core.cache import KVCache
from mlxcel_core.cache.layout import CacheLayout
from mlxcel_core.cache.state import state_bytes_per_sequence
from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineOutput,
    InsufficientMemoryError,
    OutputQueue,
    SchedulerConfig,
)
from mlxcel_core.engine.config import plan_kv_blocks
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.speculative import SpeculativeConfig, SpeculativeMethod
from mlxcel_models.language_model import MlxLmLanguageModel

from cache_kind_models import WINDOW, make_model

NUM_TOKENS = 32
CONTEXT_SIZE = 64
BLOCK_SIZE = 4
GENERATION = GenerationConfig(context_size=CONTEXT_SIZE, max_tokens=NUM_TOKENS)
PROMPT_LENGTHS = (5, 11, 3, 17, 9)
STATE_FAMILIES = ("mamba", "mamba2", "jamba", "qwen3_next", "falcon_h1", "recurrent_gemma")
WINDOWED_FAMILIES = ("recurrent_gemma", "step3p5")
# Windowed layers beside full-attention ones: a block group of their own.
MIXED_FAMILIES = ("gemma3_text", "gpt_oss")
FAMILIES = (*STATE_FAMILIES, "step3p5", *MIXED_FAMILIES)


def make_prompts(lengths: Sequence[int]) -> list[tuple[int, ...]]:
    """Prompts of the given lengths within the 64-token vocabulary, no two alike."""
    return [tuple((3 + 13 * i + 5 * j) % 64 for j in range(n)) for i, n in enumerate(lengths)]


def make_config(**kwargs) -> EngineConfig:
    settings = {
        "scheduler": SchedulerConfig(max_num_seqs=4, max_prefill_chunk=8),
        "context_size": CONTEXT_SIZE,
        "block_size": BLOCK_SIZE,
        "num_kv_blocks": 64,
    }
    return EngineConfig(**{**settings, **kwargs})


def mlx_lm_greedy(model: MlxLmLanguageModel, prompt: Sequence[int]) -> list[int]:
    """mlx-lm's own greedy tokens for `prompt`, with its own caches."""
    steps = generate_step(mx.array(prompt), model.module, max_tokens=NUM_TOKENS)
    return [int(token) for token, _ in steps]


class RecordingModel:
    """Passes calls through to a model (with its cache layout) and records each (B, L)."""

    def __init__(self, model: MlxLmLanguageModel) -> None:
        self.model = model
        self.shapes: list[tuple[int, int]] = []

    @property
    def cache_layout(self) -> CacheLayout:
        return self.model.cache_layout

    def make_cache(self) -> list[KVCache]:
        return self.model.make_cache()

    def __call__(self, tokens: mx.array, cache, *, last_only=False):
        self.shapes.append(tuple(tokens.shape))
        return self.model(tokens, cache, last_only=last_only)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request) -> tuple[str, MlxLmLanguageModel, list[list[int]]]:
    """A family's name, its model and mlx-lm's greedy tokens for each prompt."""
    model = make_model(request.param)
    references = [mlx_lm_greedy(model, prompt) for prompt in make_prompts(PROMPT_LENGTHS)]
    return request.param, model, references


def test_the_layouts_hold_the_kinds_under_test():
    layouts = {name: make_model(name).cache_layout for name in FAMILIES}
    assert all(layouts[name].has_state for name in STATE_FAMILIES)
    assert not layouts["step3p5"].has_state
    assert {name for name, layout in layouts.items() if layout.kv_window == WINDOW} == set(
        WINDOWED_FAMILIES
    )
    assert [len(parts) for parts in layouts["falcon_h1"].layers] == [2, 2]
    assert layouts["mamba"].attention_parts == ()


def test_each_prompt_alone_equals_mlx_lm(family, async_scheduling):
    name, model, references = family
    with running_engine(model, make_config(async_scheduling=async_scheduling)) as engine:
        for prompt, expected in zip(make_prompts(PROMPT_LENGTHS), references, strict=True):
            (outputs,) = generate_all(engine, [make_request(prompt, generation=GENERATION)])
            assert token_ids(outputs) == expected, name
    assert len(set(map(tuple, references))) == len(references)


def test_batched_prompts_of_different_lengths_equal_mlx_lm(family, async_scheduling):
    name, model, references = family
    recording = RecordingModel(model)
    prompts = make_prompts(PROMPT_LENGTHS)
    with running_engine(recording, make_config(async_scheduling=async_scheduling)) as engine:
        recording.shapes.clear()  # drop the profiling pass
        outputs = generate_all(
            engine,
            [make_request(p, index=i, generation=GENERATION) for i, p in enumerate(prompts)],
        )
    assert [token_ids(o) for o in outputs] == references, name
    # Prompts were chunked (8 tokens at most), decode rows batched up to 4 sequences.
    assert max(length for _, length in recording.shapes) == 8
    assert (4, 1) in recording.shapes


def test_preemption_restarts_the_state_and_keeps_the_outputs(family, async_scheduling):
    name, model, references = family
    # Room for one full context (or, windowed, one window and a chunk), not four.
    num_blocks = 8 if name in WINDOWED_FAMILIES else CONTEXT_SIZE // BLOCK_SIZE + 2
    prompts = make_prompts(PROMPT_LENGTHS)
    with running_engine(
        model, make_config(async_scheduling=async_scheduling, num_kv_blocks=num_blocks)
    ) as engine:
        outputs = generate_all(
            engine,
            [make_request(p, index=i, generation=GENERATION) for i, p in enumerate(prompts)],
        )
        stats = engine.stats
    assert stats.num_preemptions > 0
    assert [token_ids(o) for o in outputs] == references, name
    assert stats.num_kv_blocks_used == 0


@pytest.mark.parametrize("prompt_length", [5, 11])
def test_forked_choices_start_from_the_first_choices_state(family, prompt_length, async_scheduling):
    """The later choices of one prompt share its KV and copy the first choice's state at
    the prompt's last token, computing only that token; each samples what it samples
    alone (mlxcel's single-sequence path on mlx-lm's caches)."""
    name, model, _ = family
    prompt = make_prompts([prompt_length])[0]
    samplings = [SamplingParams(temperature=0.9, seed=seed) for seed in (1, 2, 3)]
    generation = GenerationConfig(context_size=CONTEXT_SIZE, max_tokens=12)
    expected = [
        token_ids(generate_alone(model, prompt, sampling=s, generation=generation))
        for s in samplings
    ]
    with running_engine(model, make_config(async_scheduling=async_scheduling)) as engine:
        outputs = generate_all(
            engine,
            [
                make_request(prompt, index=i, sampling=s, generation=generation)
                for i, s in enumerate(samplings)
            ],
        )
    assert [token_ids(o) for o in outputs] == expected, name
    assert len(set(map(tuple, expected))) == 3
    assert [o[-1].stats.cached_tokens for o in outputs] == [0] + [prompt_length - 1] * 2


@pytest.mark.parametrize("name", STATE_FAMILIES)
def test_state_models_run_without_prefix_caching(name, async_scheduling):
    model = make_model(name)
    prompt = make_prompts([14])[0]
    with running_engine(model, make_config(async_scheduling=async_scheduling)) as engine:
        (first,) = generate_all(engine, [make_request(prompt, generation=GENERATION)])
        (second,) = generate_all(engine, [make_request(prompt, generation=GENERATION)])
        stats = engine.stats
    assert token_ids(first) == token_ids(second) == mlx_lm_greedy(model, prompt)
    assert second[-1].stats.cached_tokens == 0
    assert stats.num_kv_blocks_cached == 0


class BlockWatch:
    """A sink that notes the engine's KV blocks in use at each output."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.queue = OutputQueue()
        self.blocks_used: list[int] = []

    def put(self, output: EngineOutput) -> None:
        self.blocks_used.append(self.engine.stats.num_kv_blocks_used)
        self.queue.put(output)


@pytest.mark.parametrize("name", WINDOWED_FAMILIES)
def test_blocks_behind_the_window_return_to_the_pool(name, async_scheduling):
    model = make_model(name)
    prompt = make_prompts([17])[0]
    with running_engine(model, make_config(async_scheduling=async_scheduling)) as engine:
        watch = BlockWatch(engine)
        engine.submit([make_request(prompt, generation=GENERATION)], watch)
        outputs = drain(watch.queue, 1)
        free_after = engine.stats.num_kv_blocks - engine.stats.num_kv_blocks_used
    assert token_ids(outputs) == mlx_lm_greedy(model, prompt)
    # 17 + 32 positions fill 13 blocks of 4; the sequence holds its first block, the
    # window of 8 before its newest token and that token's block: 5 at most.
    assert max(watch.blocks_used) <= 5 < -(-(17 + NUM_TOKENS) // BLOCK_SIZE)
    assert free_after == 63


def test_a_windowed_prefix_hit_needs_only_the_window_blocks(async_scheduling):
    """A first run of a 30-token prompt, in chunks of 8 on 6 usable blocks of 4, frees its
    blocks behind the window and has to evict the oldest (positions 4-11) for its last
    chunk. A later run of the same prompt still hits the blocks its window needs (and the
    first), and generates mlx-lm's tokens."""
    model = make_model("step3p5")
    prompt = make_prompts([30])[0]
    one_token = GenerationConfig(context_size=CONTEXT_SIZE, max_tokens=1)
    with running_engine(
        model, make_config(async_scheduling=async_scheduling, num_kv_blocks=7)
    ) as engine:
        generate_all(engine, [make_request(prompt, generation=one_token)])
        (second,) = generate_all(engine, [make_request(prompt, generation=GENERATION)])
    assert token_ids(second) == mlx_lm_greedy(model, prompt)
    # Left to right, the hit would stop at the first evicted block (4 tokens); from the
    # right it reaches the last full block before the prompt's last token.
    assert second[-1].stats.cached_tokens == 28


def test_speculative_decoding_is_refused_for_a_state_model():
    config = make_config(
        speculative=SpeculativeConfig(method=SpeculativeMethod.PROMPT_LOOKUP, num_draft_tokens=2)
    )
    with pytest.raises(ValueError, match="speculative decoding is not supported for this model"):
        Engine(make_model("mamba"), config)


def test_the_memory_plan_sets_the_state_slots_aside():
    model = make_model("jamba")
    profile = profile_model(model, 4)
    # Two Mamba layers, each a (3, 64) convolution state and a (64, 8) SSM state.
    assert [[a.shape for a in layer] for layer in profile.state_layers] == [[(3, 64), (64, 8)]] * 2
    slot_bytes = state_bytes_per_sequence(profile.state_layers)
    config = make_config(num_kv_blocks=None, device_memory=2**30, memory_utilization=1.0)
    block_bytes = BLOCK_SIZE * sum(layer.bytes_per_token() for layer in profile.layers)
    with_states = plan_kv_blocks(config, profile)
    without = plan_kv_blocks(config, dataclasses.replace(profile, state_layers=()))
    assert without - with_states == pytest.approx(4 * slot_bytes / block_bytes, abs=1)
    with running_engine(model, make_config()) as engine:
        assert engine.stats.kv_cache_bytes == 4 * slot_bytes  # no block grown yet


def test_a_model_without_attention_layers_gets_blocks_for_bookkeeping_only():
    profile = profile_model(make_model("mamba"), 4)
    assert profile.layers == () and len(profile.state_layers) == 2
    config = make_config(num_kv_blocks=None, device_memory=2**30, memory_utilization=1.0)
    # Every running sequence's whole context: 4 of 16 blocks, and the null block.
    assert plan_kv_blocks(config, profile) == 4 * 16 + 1
    tight = make_config(num_kv_blocks=None, device_memory=profile.resident_bytes)
    with pytest.raises(InsufficientMemoryError, match="the recurrent state slots take"):
        plan_kv_blocks(tight, profile)
