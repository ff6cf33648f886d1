"""The continuous-batching engine's failure posture, on a fake model that predicts the
token after its last input token and raises on poisoned ones.

A failing step ends only its own requests; failures stop the engine only when consecutive;
a cache too small for one context is refused at start; a request for no tokens, or for
more context than the engine has, ends alone; a failure outside the model step stops the
engine through `on_fatal`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import mlx.core as mx
import pytest
from test_batching_engine import (
    CONTEXT_SIZE,
    GENERATION,
    GREEDY,
    TIMEOUT,
    NullDetokenizer,
    generate_all,
    make_config,
    make_request,
    running_engine,
    token_ids,
    wait_until,
)
from test_engine import drain

from mlxcel_core.cache import DenseKVCache, KVCache
from mlxcel_core.engine import (
    Engine,
    EngineClosedError,
    EngineConfig,
    EngineRequest,
    InsufficientMemoryError,
    OutputQueue,
    SchedulerConfig,
)
from mlxcel_core.request import FinishReason, GenerationConfig

VOCAB = 32


class PoisonModel:
    """Predicts `last input token + 1`; raises on any input token in `poison`."""

    def __init__(self) -> None:
        self.poison: frozenset[int] = frozenset()

    def make_cache(self) -> list[KVCache]:
        return [DenseKVCache(step=8)]

    def __call__(self, tokens: mx.array, cache: Sequence[KVCache], *, last_only=False):
        B, L = tokens.shape
        # The write comes first, so a failed step leaves a partial write behind.
        cache[0].update_and_fetch(mx.zeros((B, 1, L, 1)), mx.zeros((B, 1, L, 1)))
        if self.poison & set(tokens.reshape(-1).tolist()):
            raise RuntimeError("poisoned token")
        logits = 10.0 * mx.eye(VOCAB)[(tokens + 1) % VOCAB]
        return logits[:, -1:] if last_only else logits


def fake_request(first_token: int, *, index: int = 0, max_tokens: int = 3) -> EngineRequest:
    generation = GenerationConfig(context_size=CONTEXT_SIZE, max_tokens=max_tokens)
    return make_request((first_token,), index=index, generation=generation)


def fake_config(**kwargs) -> EngineConfig:
    return make_config(scheduler=SchedulerConfig(max_num_seqs=2), **kwargs)


def test_a_failing_step_ends_only_its_requests():
    model = PoisonModel()
    with running_engine(model, fake_config()) as engine:
        model.poison = frozenset({2})
        # 0 and 10 run together and reach the poison on their third step; 20 waits for a slot.
        outputs = generate_all(
            engine, [fake_request(t, index=i) for i, t in enumerate((0, 10, 20))]
        )
        assert [token_ids(o) for o in outputs] == [[1, 2], [11, 12], [21, 22, 23]]
        for failed in outputs[:2]:
            assert isinstance(failed[-1].error, RuntimeError)
            assert "poisoned" in str(failed[-1].error)
        assert outputs[2][-1].finish_reason is FinishReason.LENGTH
        (later,) = generate_all(engine, [fake_request(5)])
        assert token_ids(later) == [6, 7, 8] and later[-1].finish_reason is FinishReason.LENGTH
        assert engine.failure is None
        assert engine.stats.num_kv_blocks_used == 0


def test_failures_separated_by_a_success_do_not_stop_the_engine():
    model = PoisonModel()
    with running_engine(model, fake_config(max_consecutive_failures=2)) as engine:
        model.poison = frozenset({2})
        for _ in range(3):
            (failed,) = generate_all(engine, [fake_request(1)])
            assert isinstance(failed[-1].error, RuntimeError)
            (ok,) = generate_all(engine, [fake_request(10)])
            assert ok[-1].finish_reason is FinishReason.LENGTH
        assert engine.failure is None


def test_consecutive_failing_steps_stop_the_engine():
    model = PoisonModel()
    with running_engine(model, fake_config(max_consecutive_failures=2)) as engine:
        model.poison = frozenset(range(VOCAB))
        (first,) = generate_all(engine, [fake_request(3)])
        assert isinstance(first[-1].error, RuntimeError)
        assert engine.failure is None
        (second,) = generate_all(engine, [fake_request(4)])
        assert isinstance(second[-1].error, RuntimeError)
        wait_until(lambda: engine.failure is not None)
        assert isinstance(engine.failure, RuntimeError)
        with pytest.raises(EngineClosedError):
            submit_until_refused(engine)


def submit_until_refused(engine: Engine) -> None:
    """Submit until the engine refuses; it stops accepting just after setting `failure`."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        engine.submit([fake_request(5)], OutputQueue())
        time.sleep(0.002)


def test_a_cache_too_small_for_one_context_is_refused_at_start():
    # 64 tokens of context in blocks of 4 need 16 blocks besides the null block.
    with pytest.raises(InsufficientMemoryError, match="64 tokens"):
        Engine(PoisonModel(), fake_config(context_size=64, num_kv_blocks=16))
    with running_engine(PoisonModel(), fake_config(context_size=64, num_kv_blocks=17)) as engine:
        (outputs,) = generate_all(engine, [fake_request(0)])
        assert token_ids(outputs) == [1, 2, 3]


def test_a_request_for_zero_tokens_finishes_at_once_and_the_engine_goes_on():
    with running_engine(PoisonModel(), fake_config()) as engine:
        sink = OutputQueue()
        engine.submit([fake_request(1, max_tokens=0)], sink)
        output = sink.get(timeout=2.0)
        assert output.finish_reason is FinishReason.LENGTH and output.token_id is None
        assert output.stats.generated_tokens == 0
        (later,) = generate_all(engine, [fake_request(5)])
        assert token_ids(later) == [6, 7, 8]


def test_a_request_longer_than_the_engine_context_does_not_stop_the_engine():
    fatal: list[BaseException] = []
    config = fake_config(context_size=16, num_kv_blocks=5)
    engine = Engine(PoisonModel(), config, on_fatal=fatal.append)
    try:
        long_context = GenerationConfig(context_size=48, max_tokens=30)
        (outputs,) = generate_all(engine, [make_request((1,), generation=long_context)])
        assert isinstance(outputs[-1].error, ValueError)
        assert not isinstance(outputs[-1].error, EngineClosedError)
        fitting = GenerationConfig(context_size=16, max_tokens=3)
        (later,) = generate_all(engine, [make_request((5,), generation=fitting)])
        assert token_ids(later) == [6, 7, 8]
        assert fatal == [] and engine.failure is None
    finally:
        engine.shutdown(timeout=TIMEOUT)


class BrokenDetokenizer(NullDetokenizer):
    def add_token(self, token_id: int) -> str:
        raise RuntimeError("detokenizer bug")


def test_a_failure_outside_the_model_step_stops_the_engine_through_on_fatal():
    fatal: list[BaseException] = []
    engine = Engine(PoisonModel(), fake_config(), on_fatal=fatal.append)
    try:
        sink = OutputQueue()
        broken = EngineRequest(
            prompt_ids=(1,),
            sampling=GREEDY,
            generation=GENERATION,
            detokenizer=BrokenDetokenizer(),
        )
        engine.submit([broken, fake_request(5, index=1)], sink)
        outputs = drain(sink, 2)
        assert all(isinstance(o.error, EngineClosedError) for o in outputs if o.finished)
        assert [str(error) for error in fatal] == ["detokenizer bug"]
        assert engine.failure is fatal[0]
        with pytest.raises(EngineClosedError):
            engine.submit([fake_request(1)], OutputQueue())
    finally:
        engine.shutdown(timeout=TIMEOUT)
