"""The engine boundary on fake models: ordering, cancellation, overload and shutdown."""

import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

import mlx.core as mx
import pytest

from mlxcel_core.cache import DenseKVCache, KVCache
from mlxcel_core.engine import (
    Engine,
    EngineClosedError,
    EngineConfig,
    EngineOverloadedError,
    EngineRequest,
    OutputQueue,
    RequestCancelledError,
    SchedulerConfig,
)
from mlxcel_core.engine.config import MIN_PREFILL_CHUNK, prefill_chunk_for
from mlxcel_core.engine.memory import ModelProfile
from mlxcel_core.request import FinishReason, GenerationConfig
from mlxcel_core.sampling import SamplingParams

VOCAB = 32
# A guard against hangs, not a timing: a real model's first step on a GPU that other
# processes share (compiling its kernels) took over 10 s.
TIMEOUT = 60.0
GREEDY = SamplingParams(temperature=0.0)


class CountingModel:
    """Predicts `last input token + 1`; once `gate` is set, each forward waits for it."""

    def __init__(self) -> None:
        self.gate: threading.Semaphore | None = None
        self.forwards = 0

    def make_cache(self) -> list[KVCache]:
        return [DenseKVCache(step=8)]

    def __call__(self, tokens: mx.array, cache: Sequence[KVCache], *, last_only=False):
        if self.gate is not None:
            assert self.gate.acquire(timeout=TIMEOUT)
        self.forwards += 1
        B, L = tokens.shape
        cache[0].update_and_fetch(mx.zeros((B, 1, L, 1)), mx.zeros((B, 1, L, 1)))
        logits = 10.0 * mx.eye(VOCAB)[(tokens + 1) % VOCAB]
        return logits[:, -1:] if last_only else logits


class LetterDetokenizer:
    def add_token(self, token_id: int) -> str:
        return chr(ord("a") + token_id)

    def finalize(self) -> str:
        return ""


def make_request(prompt=(0,), max_tokens=3, index=0, sampling=GREEDY) -> EngineRequest:
    return EngineRequest(
        prompt_ids=prompt,
        sampling=sampling,
        generation=GenerationConfig(context_size=64, max_tokens=max_tokens),
        detokenizer=LetterDetokenizer(),
        index=index,
    )


def drain(sink: OutputQueue, count: int):
    """Outputs until `count` terminal outputs arrived."""
    outputs, finished = [], 0
    while finished < count:
        output = sink.get(timeout=TIMEOUT)
        outputs.append(output)
        finished += output.finished
    return outputs


@pytest.fixture
def engine():
    engine = Engine(CountingModel())
    yield engine
    engine.shutdown(timeout=TIMEOUT)


def test_request_streams_text_then_one_terminal_output(engine):
    sink = OutputQueue()
    engine.submit([make_request()], sink)
    outputs = drain(sink, 1)
    assert "".join(o.text for o in outputs) == "bcd"
    assert [o.finished for o in outputs] == [False, False, False, True]
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    assert outputs[-1].stats.generated_tokens == 3
    assert outputs[-1].seed is not None


def test_group_outputs_carry_their_index(engine):
    sink = OutputQueue()
    engine.submit([make_request((i,), index=i) for i in range(3)], sink)
    outputs = drain(sink, 3)
    texts = {i: "".join(o.text for o in outputs if o.index == i) for i in range(3)}
    assert texts == {0: "bcd", 1: "cde", 2: "def"}


def test_seeded_requests_report_their_seed(engine):
    sink = OutputQueue()
    engine.submit([make_request(sampling=SamplingParams(seed=42))], sink)
    assert drain(sink, 1)[-1].seed == 42


def gated_engine(
    config: EngineConfig | None = None,
) -> tuple[Engine, CountingModel, threading.Semaphore]:
    """An engine whose model runs one forward pass per `gate.release()` after start-up."""
    model = CountingModel()
    engine = Engine(model, config)
    gate = threading.Semaphore(0)
    model.gate, model.forwards = gate, 0
    return engine, model, gate


def forwards_to_first_token(engine: Engine) -> int:
    """Forward passes before the first token is out: with async scheduling the step that
    samples it is read once the next step is launched."""
    return 2 if engine.config.async_scheduling else 1


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_cancel_stops_a_running_request_within_one_step(async_scheduling):
    engine, model, gate = gated_engine(EngineConfig(async_scheduling=async_scheduling))
    try:
        sink = OutputQueue()
        handle = engine.submit([make_request(max_tokens=-1)], sink)
        gate.release(forwards_to_first_token(engine))  # the prefill step (and the next)
        first = sink.get(timeout=TIMEOUT)
        assert first.text == "b" and not first.finished
        handle.cancel()
        gate.release(100)
        rest = drain(sink, 1)
        assert isinstance(rest[-1].error, RequestCancelledError)
        # At most the steps already in flight (one more with async scheduling), then the
        # terminal output.
        in_flight = forwards_to_first_token(engine)
        assert len(rest) <= in_flight + 1
        assert model.forwards <= in_flight + 1
        assert engine.stats.num_kv_blocks_used == 0
    finally:
        engine.shutdown(timeout=TIMEOUT)


def test_cancelled_waiting_request_never_runs():
    engine, _, gate = gated_engine()
    try:
        first, second = OutputQueue(), OutputQueue()
        engine.submit([make_request()], first)
        handle = engine.submit([make_request()], second)
        handle.cancel()
        gate.release(100)
        assert drain(first, 1)[-1].finish_reason is FinishReason.LENGTH
        assert [type(o.error) for o in drain(second, 1)] == [RequestCancelledError]
    finally:
        engine.shutdown(timeout=TIMEOUT)


def test_full_waiting_queue_raises_overloaded_with_a_retry_hint():
    engine, _, gate = gated_engine(EngineConfig(max_waiting=2, retry_after_seconds=3))
    try:
        running = OutputQueue()
        engine.submit([make_request()], running)
        # The prefill step (and the next, with async scheduling); the next waits on the gate.
        gate.release(forwards_to_first_token(engine))
        running.get(timeout=TIMEOUT)  # the first request left the queue
        engine.submit([make_request(), make_request(index=1)], OutputQueue())
        with pytest.raises(EngineOverloadedError) as caught:
            engine.submit([make_request()], OutputQueue())
        assert caught.value.retry_after_seconds == 3
        assert engine.num_waiting == 2 and engine.num_running == 1
    finally:
        gate.release(100)
        engine.shutdown(timeout=TIMEOUT)


def test_a_burst_on_an_idle_engine_fills_the_free_slots_before_the_queue():
    config = EngineConfig(SchedulerConfig(max_num_seqs=2), max_waiting=2)
    engine, _, gate = gated_engine(config)
    try:
        sinks = [OutputQueue() for _ in range(4)]
        for sink in sinks:  # two run at once, two wait
            engine.submit([make_request()], sink)
        with pytest.raises(EngineOverloadedError, match="2 requests are waiting"):
            engine.submit([make_request()], OutputQueue())
        gate.release(100)
        for sink in sinks:
            assert drain(sink, 1)[-1].finish_reason is FinishReason.LENGTH
    finally:
        gate.release(100)
        engine.shutdown(timeout=TIMEOUT)


def test_shutdown_ends_running_and_waiting_requests_and_joins_the_thread():
    engine, _, gate = gated_engine()
    running, waiting = OutputQueue(), OutputQueue()
    engine.submit([make_request(max_tokens=-1)], running)
    engine.submit([make_request()], waiting)
    gate.release(forwards_to_first_token(engine))
    running.get(timeout=TIMEOUT)
    stopper = threading.Thread(target=engine.shutdown, kwargs={"timeout": TIMEOUT})
    stopper.start()
    gate.release(100)
    stopper.join(TIMEOUT)
    assert isinstance(drain(running, 1)[-1].error, EngineClosedError)
    assert isinstance(drain(waiting, 1)[-1].error, EngineClosedError)
    assert not any(t.name == "mlxcel-engine" for t in threading.enumerate())
    with pytest.raises(EngineClosedError):
        engine.submit([make_request()], OutputQueue())


def test_ctrl_c_while_the_engine_starts_joins_its_thread():
    model = CountingModel()
    model.gate = threading.Semaphore(0)
    main = threading.main_thread().ident

    def interrupt_the_start_then_let_it_finish():
        # The engine thread's start-up forward pass waits on the gate meanwhile.
        while not any(t.name == "mlxcel-engine" for t in threading.enumerate()):
            time.sleep(0.01)
        signal.pthread_kill(main, signal.SIGINT)
        time.sleep(0.2)
        model.gate.release(100)

    interrupter = threading.Thread(target=interrupt_the_start_then_let_it_finish)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        Engine(model)
    interrupter.join(TIMEOUT)
    assert not any(t.name == "mlxcel-engine" for t in threading.enumerate())


def test_a_failing_request_reports_its_error_and_the_engine_goes_on(engine):
    sink = OutputQueue()
    too_long = EngineRequest(
        prompt_ids=tuple(range(64)),
        sampling=GREEDY,
        generation=GenerationConfig(context_size=64),
        detokenizer=LetterDetokenizer(),
    )
    engine.submit([too_long], sink)
    assert isinstance(drain(sink, 1)[-1].error, ValueError)
    engine.submit([make_request()], sink)
    assert drain(sink, 1)[-1].finish_reason is FinishReason.LENGTH


def test_request_and_config_validation():
    with pytest.raises(ValueError, match="prompt_ids"):
        make_request(prompt=())
    with pytest.raises(ValueError, match="max_waiting"):
        EngineConfig(max_waiting=0)
    with pytest.raises(ValueError, match="block_size must be <= 256, got 257"):
        EngineConfig(block_size=257)


def test_a_request_cancelled_during_a_long_prompt_frees_its_slot_within_one_chunk(
    async_scheduling,
):
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=1, max_prefill_chunk=8),
        async_scheduling=async_scheduling,
    )
    engine, model, gate = gated_engine(config)
    try:
        long_prompt, waiting = OutputQueue(), OutputQueue()
        handle = engine.submit([make_request(prompt=tuple(range(1, 41)))], long_prompt)
        engine.submit([make_request()], waiting)  # no free slot: it waits
        gate.release(1)  # the first of five prefill chunks
        deadline = time.monotonic() + TIMEOUT
        while model.forwards < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        handle.cancel()
        gate.release(100)
        assert [type(o.error) for o in drain(long_prompt, 1)] == [RequestCancelledError]
        assert drain(waiting, 1)[-1].finish_reason is FinishReason.LENGTH
        # At most the chunk in flight ran after the cancel, then the waiting request's
        # prefill and its two decode steps.
        assert model.forwards <= 2 + 3
        assert engine.stats.num_kv_blocks_used == 0
    finally:
        engine.shutdown(timeout=TIMEOUT)


def test_a_time_limit_lowers_the_prefill_chunk_to_the_measured_speed_but_not_below_a_floor():
    scheduler = SchedulerConfig(max_prefill_chunk=512)
    # 0.25 s whatever the length, then 1/256 s per token.
    profile = ModelProfile((), 0, 0, VOCAB, prefill_seconds=(0.25, 1 / 256))
    assert prefill_chunk_for(EngineConfig(scheduler=scheduler), profile) == 512
    limited = EngineConfig(scheduler=scheduler, max_prefill_seconds=1.0)
    assert prefill_chunk_for(limited, profile) == 192
    assert prefill_chunk_for(replace(limited, max_prefill_seconds=0.5), profile) == 64
    slow = replace(profile, prefill_seconds=(0.25, 0.5))
    assert prefill_chunk_for(limited, slow) == MIN_PREFILL_CHUNK
    fixed_cost_too_long = replace(profile, prefill_seconds=(2.0, 0.001))
    assert prefill_chunk_for(limited, fixed_cost_too_long) == MIN_PREFILL_CHUNK
    fast = replace(profile, prefill_seconds=(0.0, 1e-5))
    assert prefill_chunk_for(limited, fast) == 512
    assert prefill_chunk_for(limited, replace(profile, prefill_seconds=None)) == 512
    with pytest.raises(ValueError, match="max_prefill_seconds must be None or > 0"):
        EngineConfig(max_prefill_seconds=0.0)


def test_the_engine_runs_the_chunk_its_start_up_speed_allows():
    tiny_limit = EngineConfig(max_prefill_seconds=1e-9)
    engine = Engine(CountingModel(), tiny_limit)
    try:
        assert engine.config.scheduler.max_prefill_chunk == MIN_PREFILL_CHUNK
    finally:
        engine.shutdown(timeout=TIMEOUT)
    engine = Engine(CountingModel(), EngineConfig())
    try:
        assert engine.config.scheduler.max_prefill_chunk == 512
    finally:
        engine.shutdown(timeout=TIMEOUT)
