"""Disaggregated prefill without a group: a `PrefillWorker` on another thread computes the
prompts' KV, which travels packed as one flat array (`kv_transfer`) into the engine's
pools. On the tiny float32 llama the engine must then give the greedy tokens it gives
prefilling itself, and keep decoding a stream while another prompt's KV is in flight."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import mlx.core as mx
import pytest

from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineRequest,
    OutputQueue,
    PrefilledKV,
    PrefillJob,
    RemotePrefill,
    SchedulerConfig,
)
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.threads import thread_stream
from mlxcel_distributed import PrefillWorker, block_layout, pack_blocks, unpack_blocks
from mlxcel_models.loading.loader import load_model

from cache_kind_models import make_model

TIMEOUT = 30.0
CONTEXT_SIZE = 64
GENERATION = GenerationConfig(context_size=CONTEXT_SIZE, max_tokens=10)


class NullDetokenizer:
    def add_token(self, token_id: int) -> str:
        return ""

    def finalize(self) -> str:
        return ""


class ThreadPrefill(RemotePrefill):
    """Prefills on a thread of its own, as the prefill rank would, with the worker built
    there (MLX arrays belong to their thread's stream); `hold` keeps each job's KV back
    until it is set."""

    def __init__(
        self,
        model: LanguageModel,
        storage: PagedKVStorage,
        deliver: Callable[[PrefilledKV], None],
        hold: threading.Event,
    ) -> None:
        self.model = model
        self.layout = block_layout(storage)
        self.deliver = deliver
        self.hold = hold
        self.jobs: queue.Queue[PrefillJob | None] = queue.Queue()
        self.num_jobs = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def submit(self, job: PrefillJob) -> None:
        self.jobs.put(job)

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()

    def _run(self) -> None:
        with thread_stream():
            worker = PrefillWorker(self.model, make_config())
            while (job := self.jobs.get()) is not None:
                flat = pack_blocks(worker.prefill(job))
                contents = unpack_blocks(flat, self.layout, job.num_blocks)
                mx.eval(contents)
                self.hold.wait(TIMEOUT)
                self.num_jobs += 1
                self.deliver(PrefilledKV(job.seq_id, job.attempt, tuple(contents)))


def make_config() -> EngineConfig:
    return EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_chunk=8),
        context_size=CONTEXT_SIZE,
        block_size=4,
        num_kv_blocks=96,
    )


@contextmanager
def disaggregated_engine(
    model: LanguageModel, hold: threading.Event
) -> Iterator[tuple[Engine, list[ThreadPrefill]]]:
    made: list[ThreadPrefill] = []

    def make_remote_prefill(storage, deliver) -> RemotePrefill:
        made.append(ThreadPrefill(model, storage, deliver, hold))
        return made[0]

    engine = Engine(model, make_config(), make_remote_prefill=make_remote_prefill)
    try:
        yield engine, made
    finally:
        engine.shutdown(timeout=TIMEOUT)


def request(prompt: Sequence[int], index: int = 0) -> EngineRequest:
    return EngineRequest(
        prompt_ids=tuple(prompt),
        sampling=SamplingParams(temperature=0.0),
        generation=GENERATION,
        detokenizer=NullDetokenizer(),
        index=index,
    )


def tokens_of(engine: Engine, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    sink = OutputQueue()
    engine.submit([request(p, i) for i, p in enumerate(prompts)], sink)
    tokens: list[list[int]] = [[] for _ in prompts]
    finished = 0
    while finished < len(prompts):
        output = sink.get(timeout=TIMEOUT)
        assert output.error is None, output.error
        if output.token_id is not None:
            tokens[output.index].append(output.token_id)
        finished += output.finished
    return tokens


# Lengths around the block size and the prefill chunk; the last two share 12 tokens (three
# blocks) with the first, so the front's prefix cache supplies part of their KV: all of the
# last one's but its last token, which leaves it nothing to prefill elsewhere.
PROMPTS = [
    tuple(range(40, 61)),
    tuple(range(70, 73)),
    (5, 9),
    tuple(range(100, 117)),
    (*range(40, 52), *range(200, 211)),
    tuple(range(40, 53)),
]


@pytest.fixture(scope="module")
def model(tiny_safetensors) -> LanguageModel:
    return load_model(tiny_safetensors).model


def test_disaggregated_prefill_gives_the_tokens_of_local_prefill(model) -> None:
    engine = Engine(model, make_config())
    try:
        local = tokens_of(engine, PROMPTS)
    finally:
        engine.shutdown(timeout=TIMEOUT)
    hold = threading.Event()
    hold.set()
    with disaggregated_engine(model, hold) as (remote_engine, prefills):
        first = tokens_of(remote_engine, PROMPTS[:4])
        # Sent after the first group finished: its full blocks are in the prefix cache.
        second = tokens_of(remote_engine, PROMPTS[4:])
        hit_rate = remote_engine.stats.prefix_cache_hit_rate
    assert first + second == local
    assert all(len(tokens) == GENERATION.max_tokens for tokens in local)
    assert prefills[0].num_jobs == len(PROMPTS) - 1
    assert hit_rate > 0


def test_a_stream_decodes_while_another_prompts_kv_is_in_flight(model) -> None:
    hold = threading.Event()
    hold.set()
    with disaggregated_engine(model, hold) as (engine, _):
        first_sink = OutputQueue()
        engine.submit([request(PROMPTS[0])], first_sink)
        assert first_sink.get(timeout=TIMEOUT).token_id is not None
        hold.clear()
        second_sink = OutputQueue()
        engine.submit([request(PROMPTS[3])], second_sink)
        first_tokens = 1
        while not (output := first_sink.get(timeout=TIMEOUT)).finished:
            first_tokens += 1
        # The whole first stream ended while the second prompt's KV was held back.
        assert first_tokens == GENERATION.max_tokens
        assert output.error is None
        with pytest.raises(queue.Empty):
            second_sink.get(timeout=0)
        hold.set()
        outputs = [second_sink.get(timeout=TIMEOUT) for _ in range(GENERATION.max_tokens + 1)]
    assert outputs[-1].finished and outputs[-1].error is None


def test_kv_arriving_for_an_ended_request_is_dropped(model) -> None:
    engine = Engine(model, make_config())
    try:
        expected = tokens_of(engine, [PROMPTS[1]])
    finally:
        engine.shutdown(timeout=TIMEOUT)
    hold = threading.Event()
    with disaggregated_engine(model, hold) as (engine, _):
        cancelled_sink = OutputQueue()
        handle = engine.submit([request(PROMPTS[0])], cancelled_sink)
        handle.cancel()
        # Its KV is held back while a one-token prompt, prefilled here, runs and the
        # cancellation ends it.
        assert tokens_of(engine, [(7,)])[0]
        assert cancelled_sink.get(timeout=TIMEOUT).error is not None
        hold.set()
        assert tokens_of(engine, [PROMPTS[1]]) == expected


def test_a_model_with_windowed_layers_keeps_one_block_group_for_the_prefill_rank() -> None:
    """The prefill rank hands over one block table's contents, so a model mixing windowed
    and full-attention layers (Gemma 3) keeps every layer in one group there, and gives
    the tokens it gives with its window group prefilling itself."""
    mixed = make_model("gemma3_text")
    prompts = [tuple(p % 64 for p in prompt) for prompt in PROMPTS]
    engine = Engine(mixed, make_config())
    try:
        local = tokens_of(engine, prompts)
        assert len(engine.stats.kv_groups) == 2
    finally:
        engine.shutdown(timeout=TIMEOUT)
    hold = threading.Event()
    hold.set()
    with disaggregated_engine(mixed, hold) as (remote_engine, prefills):
        remote = tokens_of(remote_engine, prompts)
        assert len(remote_engine.stats.kv_groups) == 1
    assert remote == local
    assert prefills[0].num_jobs > 0
