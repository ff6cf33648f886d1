"""The engine over a runner that keeps several steps in flight, as a pipeline's rank 0 does:
each step holds sequences the steps in flight do not, and the tokens are those of the
single-sequence path, through chunked prefill, waiting for slots and preemption.

The runner here builds each step's graph in `start` and evaluates it in `finish`, so steps
write their KV in the order they started, as the stages of a pipeline do.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Sequence

import pytest
from test_batching_engine import (
    TIMEOUT,
    generate_all,
    generate_alone,
    make_config,
    make_prompts,
    make_request,
    token_ids,
    wait_until,
)
from test_batching_engine_failures import PoisonModel, fake_config, fake_request
from test_engine import drain

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    ModelRunner,
    OutputQueue,
    RequestCancelledError,
    RowInput,
    SchedulerConfig,
)
from mlxcel_core.engine.runner import StepLogits
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.request import FinishReason, GenerationConfig
from mlxcel_models.loading.loader import load_model


@pytest.fixture(scope="module")
def model(tiny_safetensors) -> LanguageModel:
    return load_model(tiny_safetensors).model


@pytest.fixture(scope="module")
def greedy_references(model) -> list[list[int]]:
    return [token_ids(generate_alone(model, prompt)) for prompt in make_prompts()]


class DeferredRunner(ModelRunner):
    """Keeps up to `depth` steps in flight; records each step's rows' first blocks (one
    per sequence: no test here forks) and how many steps were in flight at each start.

    `fail_next_finish` loses every step in flight (as a lost rank does); `fail_while_busy`
    makes the first `prepare_storage` ("prepare") or `start` ("start") called while a step
    is in flight raise before anything is sent, which leaves the steps in flight intact.
    """

    def __init__(self, model: LanguageModel, storage: PagedKVStorage, depth: int) -> None:
        super().__init__(model, storage)
        self.steps_in_flight = depth
        self.in_flight: deque[tuple[StepLogits, frozenset[int]]] = deque()
        self.overlapping_starts: list[int] = []
        self.shared_sequences = 0
        self.fail_next_finish = False
        self.fail_while_busy: str | None = None
        self.gate: threading.Semaphore | None = None
        self.waiting = False

    @property
    def num_started(self) -> int:
        return len(self.in_flight)

    def prepare_storage(self, num_blocks, copies) -> None:
        self._fail_if_busy("prepare")
        super().prepare_storage(num_blocks, copies)

    def _fail_if_busy(self, where: str) -> None:
        if self.fail_while_busy == where and self.in_flight:
            self.fail_while_busy = None
            raise RuntimeError(f"injected failure in {where}")

    def start(self, rows: Sequence[RowInput]) -> None:
        self._fail_if_busy("start")
        firsts = frozenset(row.block_tables[0][0] for row in rows)
        self.shared_sequences += sum(len(firsts & earlier) for _, earlier in self.in_flight)
        self.overlapping_starts.append(len(self.in_flight))
        self.in_flight.append((self.run(rows), firsts))

    def finish(self) -> StepLogits:
        if self.fail_next_finish:
            self.fail_next_finish = False
            self.in_flight.clear()
            raise RuntimeError("a stage was lost")
        if self.gate is not None:
            self.waiting = True
            if not self.gate.acquire(timeout=TIMEOUT):
                raise TimeoutError("the test never opened the gate")
            self.waiting = False
        step, _ = self.in_flight.popleft()
        return step


class Runners:
    """The engine's runner factory, keeping the runner it built."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.runner: DeferredRunner | None = None

    def __call__(
        self, model: LanguageModel, storage: PagedKVStorage, adapters: RowAdapterScales | None
    ) -> ModelRunner:
        self.runner = DeferredRunner(model, storage, self.depth)
        return self.runner


def run_prompts(
    model: LanguageModel, config: EngineConfig, depth: int
) -> tuple[list[list[int]], DeferredRunner, int]:
    """Greedy tokens of every prompt of `make_prompts`, submitted together."""
    runners = Runners(depth)
    engine = Engine(model, config, make_runner=runners)
    try:
        outputs = generate_all(
            engine, [make_request(p, index=i) for i, p in enumerate(make_prompts())]
        )
        assert all(o[-1].finish_reason is FinishReason.LENGTH for o in outputs)
        num_preemptions = engine.stats.num_preemptions
        assert engine.stats.num_kv_blocks_used == 0
    finally:
        engine.shutdown(timeout=TIMEOUT)
    assert runners.runner is not None
    return [token_ids(o) for o in outputs], runners.runner, num_preemptions


@pytest.mark.parametrize("depth", [2, 3])
def test_steps_in_flight_give_the_single_sequence_tokens(model, greedy_references, depth):
    # Six slots for the six prompts: each of `depth` steps in flight takes its share.
    config = make_config(scheduler=SchedulerConfig(max_num_seqs=6, max_prefill_chunk=8))
    tokens, runner, _ = run_prompts(model, config, depth)
    assert tokens == greedy_references
    assert max(runner.overlapping_starts) == depth - 1  # steps really were in flight together
    assert runner.shared_sequences == 0


def test_steps_in_flight_give_the_same_tokens_across_preemption(model, greedy_references):
    # 13 usable blocks: one full context fits, four growing sequences do not.
    tokens, runner, num_preemptions = run_prompts(model, make_config(num_kv_blocks=14), 2)
    assert num_preemptions > 0
    assert tokens == greedy_references
    assert runner.shared_sequences == 0


def test_a_pipeline_of_full_slots_still_overlaps_its_steps(model, greedy_references):
    # Two slots for six prompts: the waiting ones must not make one step take both.
    config = make_config(scheduler=SchedulerConfig(max_num_seqs=2, max_prefill_chunk=8))
    tokens, runner, _ = run_prompts(model, config, 2)
    assert tokens == greedy_references
    # All but the first start, and the last ones with a single sequence left, overlap.
    overlapping = sum(1 for count in runner.overlapping_starts if count)
    assert overlapping >= 0.9 * len(runner.overlapping_starts)


@pytest.mark.parametrize("where", ["prepare", "start"])
def test_a_step_that_fails_before_it_is_sent_ends_only_its_requests(
    model, greedy_references, where
):
    runners = Runners(2)
    config = make_config(scheduler=SchedulerConfig(max_num_seqs=6, max_prefill_chunk=8))
    engine = Engine(model, config, make_runner=runners)
    try:
        assert runners.runner is not None
        runners.runner.fail_while_busy = where
        outputs = generate_all(
            engine, [make_request(p, index=i) for i, p in enumerate(make_prompts())]
        )
        assert runners.runner.fail_while_busy is None  # the failure happened
        failed = [i for i, o in enumerate(outputs) if o[-1].error is not None]
        assert failed and len(failed) < len(outputs)
        assert all(f"injected failure in {where}" in str(outputs[i][-1].error) for i in failed)
        # The steps in flight beside the failed one, and every later step, sample their own
        # logits: the other requests get the single-sequence tokens.
        for i, output in enumerate(outputs):
            if i not in failed:
                assert token_ids(output) == greedy_references[i]
        (later,) = generate_all(engine, [make_request(make_prompts()[0])])
        assert token_ids(later) == greedy_references[0]
        assert engine.stats.num_kv_blocks_used == 0
    finally:
        engine.shutdown(timeout=TIMEOUT)


def test_a_lost_step_in_flight_ends_the_requests_of_every_step_in_flight():
    model = PoisonModel()
    runners = Runners(2)
    engine = Engine(model, fake_config(), make_runner=runners)
    try:
        assert runners.runner is not None
        runners.runner.fail_next_finish = True
        # 0 and 10 run in separate steps in flight; the failure ends both, 20 then runs.
        outputs = generate_all(
            engine, [fake_request(t, index=i) for i, t in enumerate((0, 10, 20))]
        )
        for failed in outputs[:2]:
            assert token_ids(failed) == []
            assert "a stage was lost" in str(failed[-1].error)
        assert token_ids(outputs[2]) == [21, 22, 23]
        assert engine.failure is None
        assert engine.stats.num_kv_blocks_used == 0
    finally:
        engine.shutdown(timeout=TIMEOUT)


def test_requests_cancelled_while_in_flight_end_after_their_steps(model):
    runners = Runners(2)
    engine = Engine(model, make_config(), make_runner=runners)
    runner = runners.runner
    assert runner is not None
    gate = runner.gate = threading.Semaphore(0)
    try:
        sink = OutputQueue()
        unlimited = GenerationConfig(context_size=48)
        prompts = make_prompts()
        handles = [
            engine.submit([make_request(prompts[i], index=i, generation=unlimited)], sink)
            for i in range(2)
        ]
        gate.release(6)
        # The engine waits on one step while the other sequence's step is in flight.
        wait_until(lambda: runner.waiting and len(runner.in_flight) == 2)
        for handle in handles:
            handle.cancel()
        gate.release(100)
        outputs = drain(sink, 2)
        wait_until(lambda: engine.stats.num_running == 0)
        (later,) = generate_all(engine, [make_request(prompts[2])])
        assert later[-1].finish_reason is FinishReason.LENGTH
        with pytest.raises(queue.Empty):
            sink.get(timeout=0.2)  # nothing follows a terminal output
        for index in range(2):
            mine = [o for o in outputs if o.index == index]
            assert isinstance(mine[-1].error, RequestCancelledError)
            assert token_ids(mine)
        assert engine.stats.num_kv_blocks_used == 0
    finally:
        gate.release(1000)
        engine.shutdown(timeout=TIMEOUT)
