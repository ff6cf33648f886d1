"""The continuous-batching engine against the single-sequence path, and cancellation.

On the tiny float32 llama, every batched run (chunked prefill, waiting for a slot, block
growth, preemption, prefix hits, forked choices, sliding-window layers, rows drawn
together and alone) must give the tokens and log probabilities that `stream_generate`
gives for each prompt alone; a cancelled request frees its blocks. The failure posture is
tested in test_batching_engine_failures.py; the other engine tests build their requests,
configs and engines from the helpers here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import mlx.core as mx
import pytest
from test_engine import drain, forwards_to_first_token

from mlxcel_core.cache import KVCache
from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineOutput,
    EngineRequest,
    OutputQueue,
    RequestCancelledError,
    SchedulerConfig,
)
from mlxcel_core.generate import GenerationChunk, stream_generate
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.request import FinishReason, GenerationConfig
from mlxcel_core.sampling import Sampler, SamplingParams
from mlxcel_models.loading.loader import load_model

from factories import TinyConfig, write_sliding_window_model

TIMEOUT = 20.0
BLOCK_SIZE = 4
CONTEXT_SIZE = 48
GREEDY = SamplingParams(temperature=0.0)
GENERATION = GenerationConfig(context_size=CONTEXT_SIZE, max_tokens=10)
PROMPT_LENGTHS = (3, 9, 14, 5, 21, 1)


class NullDetokenizer:
    def add_token(self, token_id: int) -> str:
        return ""

    def finalize(self) -> str:
        return ""


def make_prompts(lengths: Sequence[int] = PROMPT_LENGTHS) -> list[tuple[int, ...]]:
    """Prompts of the given lengths, no two starting alike (so no prefix-cache hits)."""
    return [tuple(range(30 + 7 * i, 30 + 7 * i + n)) for i, n in enumerate(lengths)]


def make_request(
    prompt: Sequence[int],
    *,
    index: int = 0,
    sampling: SamplingParams = GREEDY,
    generation: GenerationConfig = GENERATION,
) -> EngineRequest:
    return EngineRequest(
        prompt_ids=tuple(prompt),
        sampling=sampling,
        generation=generation,
        detokenizer=NullDetokenizer(),
        index=index,
    )


def make_config(**kwargs) -> EngineConfig:
    settings = {
        "scheduler": SchedulerConfig(max_num_seqs=4, max_prefill_chunk=8),
        "context_size": CONTEXT_SIZE,
        "block_size": BLOCK_SIZE,
        "num_kv_blocks": 64,
    }
    return EngineConfig(**{**settings, **kwargs})


@contextmanager
def running_engine(
    model: LanguageModel, config: EngineConfig, draft_model: LanguageModel | None = None
) -> Iterator[Engine]:
    engine = Engine(model, config, draft_model=draft_model)
    try:
        yield engine
    finally:
        engine.shutdown(timeout=TIMEOUT)


def generate_all(engine: Engine, requests: Sequence[EngineRequest]) -> list[list[EngineOutput]]:
    """Submit one group and return each request's outputs, by index."""
    sink = OutputQueue()
    engine.submit(requests, sink)
    outputs = drain(sink, len(requests))
    return [[o for o in outputs if o.index == i] for i in range(len(requests))]


def token_ids(outputs: Sequence[EngineOutput | GenerationChunk]) -> list[int]:
    return [o.token_id for o in outputs if o.token_id is not None]


def generate_alone(
    model: LanguageModel,
    prompt: Sequence[int],
    *,
    sampling: SamplingParams = GREEDY,
    generation: GenerationConfig = GENERATION,
) -> list[GenerationChunk]:
    """The single-sequence reference path."""
    sampler = Sampler(sampling)
    return list(stream_generate(model, prompt, sampler, NullDetokenizer(), generation))


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the engine"
        time.sleep(0.002)


@pytest.fixture(scope="module")
def model(tiny_safetensors) -> LanguageModel:
    return load_model(tiny_safetensors).model


@pytest.fixture(scope="module")
def greedy_references(model) -> list[list[int]]:
    return [token_ids(generate_alone(model, prompt)) for prompt in make_prompts()]


class RecordingModel:
    """Passes calls through to a model and records each forward's (B, L)."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.shapes: list[tuple[int, int]] = []

    def make_cache(self) -> list[KVCache]:
        return self.model.make_cache()

    def __call__(self, tokens: mx.array, cache: Sequence[KVCache], *, last_only=False):
        self.shapes.append(tuple(tokens.shape))
        return self.model(tokens, cache, last_only=last_only)


# Equal to the single-sequence path


def test_batched_greedy_outputs_equal_single_sequence_outputs(model, greedy_references):
    recording = RecordingModel(model)
    with running_engine(recording, make_config()) as engine:
        recording.shapes.clear()  # drop the profiling pass
        outputs = generate_all(
            engine, [make_request(p, index=i) for i, p in enumerate(make_prompts())]
        )
        stats = engine.stats
    assert [token_ids(o) for o in outputs] == greedy_references
    assert all(o[-1].finish_reason is FinishReason.LENGTH for o in outputs)
    assert all(len(ids) == 10 for ids in greedy_references)
    # Prompts were chunked (no pass over 8 tokens, the 21-token one took 3 chunks), decode
    # rows were batched up to the 4 running sequences, and the rest waited for a slot.
    assert max(length for _, length in recording.shapes) == 8
    assert max(batch for batch, _ in recording.shapes) == 4
    assert sum(batch for batch, length in recording.shapes if length > 1) >= 8
    assert stats.num_preemptions == 0 and stats.num_kv_blocks_used == 0


def test_seeded_sampling_is_the_same_alone_and_batched(model):
    seeded = SamplingParams(temperature=0.8, seed=1234)
    unseeded = SamplingParams(temperature=0.8)
    prompts = make_prompts()
    with running_engine(model, make_config()) as engine:
        (alone,) = generate_all(engine, [make_request(prompts[2], sampling=seeded)])
        batched = generate_all(
            engine,
            [
                make_request(prompts[0], index=0, sampling=unseeded),
                make_request(prompts[2], index=1, sampling=seeded),
                make_request(prompts[4], index=2, sampling=unseeded),
                make_request(prompts[1], index=3, sampling=unseeded),
            ],
        )
    assert token_ids(batched[1]) == token_ids(alone)
    assert token_ids(alone) == token_ids(generate_alone(model, prompts[2], sampling=seeded))
    assert batched[1][-1].seed == alone[-1].seed == 1234
    assert len(set(token_ids(alone))) > 1  # really sampled, not one repeated argmax


def test_preemption_keeps_outputs_equal_to_single_sequence_ones(model, greedy_references):
    # 13 usable blocks: one full context (12 blocks) fits, four growing sequences do not.
    with running_engine(model, make_config(num_kv_blocks=14)) as engine:
        outputs = generate_all(
            engine, [make_request(p, index=i) for i, p in enumerate(make_prompts())]
        )
        stats = engine.stats
    assert stats.num_preemptions > 0
    assert [token_ids(o) for o in outputs] == greedy_references
    assert stats.num_kv_blocks_used == 0


def test_seeded_requests_draw_the_same_tokens_across_preemption(model):
    prompts = make_prompts()
    requests = [
        make_request(p, index=i, sampling=SamplingParams(temperature=0.8, seed=100 + i))
        for i, p in enumerate(prompts)
    ]
    alone = [token_ids(generate_alone(model, r.prompt_ids, sampling=r.sampling)) for r in requests]
    with running_engine(model, make_config(num_kv_blocks=14)) as engine:
        outputs = generate_all(engine, requests)
        assert engine.stats.num_preemptions > 0
    assert [token_ids(o) for o in outputs] == alone


def test_a_repeated_prompt_hits_the_prefix_cache_and_gives_the_same_output(
    model, greedy_references
):
    prompt = make_prompts()[2]  # 14 tokens: 3 full blocks can be reused, 2 tokens computed
    with running_engine(model, make_config()) as engine:
        (first,) = generate_all(engine, [make_request(prompt)])
        (second,) = generate_all(engine, [make_request(prompt)])
        stats = engine.stats
    assert first[-1].stats.cached_tokens == 0
    assert second[-1].stats.cached_tokens == 12
    assert second[-1].stats.cached_tokens % BLOCK_SIZE == 0
    assert token_ids(first) == token_ids(second) == greedy_references[2]
    assert stats.prefix_cache_hit_tokens == 12


@pytest.mark.parametrize(
    ("cache_residual", "prefill_chunk", "cached"),
    # A window's prompt reads its first chunk exactly when computed afresh, and a cached
    # prefix as stored: a prefix shorter than a chunk is computed afresh instead.
    [(0, 4, 12), (4, 16, 0), (4, 12, 12)],
)
def test_a_residual_window_uses_a_cached_prefix_of_one_prefill_chunk_or_more(
    model, cache_residual, prefill_chunk, cached
):
    prompt = make_prompts()[2]  # 14 tokens: 3 full blocks can be reused
    config = make_config(
        scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_chunk=prefill_chunk),
        cache_type_k="turbo4",
        cache_type_v="turbo4",
        cache_residual=cache_residual,
    )
    with running_engine(model, config) as engine:
        generate_all(engine, [make_request(prompt)])
        (second,) = generate_all(engine, [make_request(prompt)])
    assert second[-1].stats.cached_tokens == cached


@pytest.mark.parametrize("prompt_length", [9, 11])
def test_choices_of_one_prompt_fork_its_prompt_kv_and_sample_their_own_tokens(model, prompt_length):
    """The later choices share the first one's prompt blocks and compute only the prompt's
    last token each (for 11 tokens in blocks of 4, into the shared third block, copied on
    write; for 9, into a fresh block), and each choice still samples
    exactly what it samples alone."""
    prompt = make_prompts([prompt_length])[0]
    samplings = [SamplingParams(temperature=0.9, seed=seed) for seed in (1, 2, 3)]
    expected = [token_ids(generate_alone(model, prompt, sampling=s)) for s in samplings]
    recording = RecordingModel(model)
    with running_engine(recording, make_config()) as engine:
        recording.shapes.clear()
        outputs = generate_all(
            engine, [make_request(prompt, index=i, sampling=s) for i, s in enumerate(samplings)]
        )
        blocks_used = engine.stats.num_kv_blocks_used
    assert [token_ids(o) for o in outputs] == expected
    assert len(set(map(tuple, expected))) == 3
    assert [o[-1].stats.cached_tokens for o in outputs] == [0, prompt_length - 1, prompt_length - 1]
    # The prompt was computed once, plus its last token once per child, plus 9 decode
    # tokens per choice (the 10th sampled token is never fed back).
    computed = sum(batch * length for batch, length in recording.shapes)
    assert computed == prompt_length + 2 + 3 * 9
    assert blocks_used == 0


def test_a_copy_on_write_fork_keeps_the_parents_later_tokens_apart(model):
    """Prompt of 10 with blocks of 4: the shared third block holds positions 8-11, which
    the parent and both children write, so copy-on-write must keep them apart."""
    prompt = make_prompts([10])[0]
    samplings = [SamplingParams(temperature=0.9, seed=seed) for seed in (7, 8, 9)]
    expected = [token_ids(generate_alone(model, prompt, sampling=s)) for s in samplings]
    with running_engine(model, make_config()) as engine:
        outputs = generate_all(
            engine, [make_request(prompt, index=i, sampling=s) for i, s in enumerate(samplings)]
        )
    assert [token_ids(o) for o in outputs] == expected


def test_batched_outputs_on_sliding_window_layers_equal_single_sequence_outputs(tmp_path):
    folder = write_sliding_window_model(tmp_path / "llama", TinyConfig(seed=5), window=5)
    windowed = load_model(folder).model
    prompts = make_prompts()
    references = [token_ids(generate_alone(windowed, prompt)) for prompt in prompts]
    with running_engine(windowed, make_config()) as engine:
        outputs = generate_all(engine, [make_request(p, index=i) for i, p in enumerate(prompts)])
        # The same prompt again reuses blocks whose keys fall partly outside the window.
        (again,) = generate_all(engine, [make_request(prompts[4])])
    assert [token_ids(o) for o in outputs] == references
    assert token_ids(again) == references[4]
    assert again[-1].stats.cached_tokens == 20


def test_batched_logprobs_equal_single_sequence_logprobs(model):
    generation = GenerationConfig(context_size=CONTEXT_SIZE, max_tokens=6, num_top_logprobs=2)
    prompts = make_prompts()[:4]
    with running_engine(model, make_config()) as engine:
        outputs = generate_all(
            engine,
            [make_request(p, index=i, generation=generation) for i, p in enumerate(prompts)],
        )
    for prompt, batched in zip(prompts, outputs, strict=True):
        alone = [c for c in generate_alone(model, prompt, generation=generation) if c.token_id]
        got = [o for o in batched if o.token_id is not None]
        assert [o.token_id for o in got] == [c.token_id for c in alone]
        for engine_output, chunk in zip(got, alone, strict=True):
            expected, actual = chunk.logprobs, engine_output.logprobs
            assert actual is not None and expected is not None
            assert actual.token_id == expected.token_id
            assert actual.top_ids == expected.top_ids and len(actual.top_ids) == 2
            assert actual.logprob == pytest.approx(expected.logprob, abs=1e-5)
            assert actual.top_logprobs == pytest.approx(expected.top_logprobs, abs=1e-5)


def test_rows_drawn_together_and_alone_in_one_batch_each_get_their_own_tokens(model):
    # Greedy and same-settings seeded rows draw together; penalties and logit bias draw alone.
    samplings = [
        GREEDY,
        SamplingParams(temperature=0.8, seed=7),
        SamplingParams(temperature=0.8, seed=8),
        SamplingParams(temperature=0.8, seed=9, repeat_penalty=1.3),
        SamplingParams(temperature=0.8, seed=10, logit_bias={40: 3.0}),
        SamplingParams(temperature=0.0, presence_penalty=1.5),
    ]
    prompts = make_prompts()
    requests = [
        make_request(prompt, index=i, sampling=sampling)
        for i, (prompt, sampling) in enumerate(zip(prompts, samplings, strict=True))
    ]
    with running_engine(model, make_config()) as engine:
        outputs = generate_all(engine, requests)
    for request, output in zip(requests, outputs, strict=True):
        reference = generate_alone(model, request.prompt_ids, sampling=request.sampling)
        assert token_ids(output) == token_ids(reference)


# Cancellation


class GatedModel(RecordingModel):
    """Once `gate` is set, each forward waits for one `gate.release()`."""

    def __init__(self, model: LanguageModel) -> None:
        super().__init__(model)
        self.gate: threading.Semaphore | None = None

    def __call__(self, tokens: mx.array, cache: Sequence[KVCache], *, last_only=False):
        if self.gate is not None and not self.gate.acquire(timeout=TIMEOUT):
            raise TimeoutError("the test never opened the gate")
        return super().__call__(tokens, cache, last_only=last_only)


def test_cancellation_frees_the_requests_blocks(model):
    gated = GatedModel(model)
    engine = Engine(gated, make_config())
    gate = threading.Semaphore(0)
    gated.gate = gate
    try:
        sink = OutputQueue()
        unlimited = GenerationConfig(context_size=CONTEXT_SIZE)
        handle = engine.submit([make_request(make_prompts()[2], generation=unlimited)], sink)
        # The 14-token prompt in chunks of 8 and 6 (and the next step, with async scheduling).
        in_flight = forwards_to_first_token(engine)
        gate.release(1 + in_flight)
        first = sink.get(timeout=TIMEOUT)
        assert first.token_id is not None and not first.finished
        wait_until(lambda: engine.stats.num_kv_blocks_used == 4)
        handle.cancel()
        gate.release(100)
        rest = drain(sink, 1)
        assert isinstance(rest[-1].error, RequestCancelledError)
        assert len(rest) <= in_flight + 1  # at most the steps in flight, then the terminal one
        wait_until(lambda: engine.stats.num_running == 0)
        assert engine.stats.num_kv_blocks_used == 0
    finally:
        gate.release(1000)
        engine.shutdown(timeout=TIMEOUT)
