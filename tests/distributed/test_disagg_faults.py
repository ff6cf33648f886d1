"""Rank 0's fault handling under `--disaggregate`, in-process on the tiny model with a fake
prefill rank: a prompt's KV held to `--stage-timeout` per prefill chunk, a failed link,
and rank 1's exit each degrade the server naming rank 1, ending the request whose KV is in
flight, and those queued behind it, with that error; KV that arrives in time is used as
usual."""

from __future__ import annotations

import asyncio
import io
import threading
import time

import mlx.core as mx
import pytest

from mlxcel.distributed.disaggregate_flags import DisaggregatedRank
from mlxcel.distributed.stage_faults import guard_prefill
from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineOutput,
    EngineRequest,
    EngineUnavailableError,
    OutputQueue,
    PrefillJob,
    SchedulerConfig,
)
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_distributed import (
    PrefillDeadline,
    StageFault,
    StageHealth,
    StepWatchdog,
    disaggregate_front,
)
from mlxcel_models.loading.loader import load_model
from mlxcel_server import ServerSettings, ServerState, ServingModel, create_app

# Bounds every wait on another thread, so a broken fault path fails instead of hanging.
WAIT_SECONDS = 10.0
CHUNK = 8
# 21 tokens: all but the last go to the prefill rank, in 3 chunks of 8.
PROMPT = tuple(range(40, 61))


class FakePrefillRank:
    """Stands in for the link to rank 1, which is ready at once: records the jobs sent,
    and answers each receive with zeros once `release` is set, or raises `error` then."""

    def __init__(self) -> None:
        self.jobs: list[PrefillJob | None] = []
        self.receiving = threading.Event()
        self.release = threading.Event()
        self.error: Exception | None = None

    def receive_ready(self, peer: int, group) -> None:
        assert peer == 1

    def send_job(self, job: PrefillJob | None, peer: int, group) -> int:
        assert peer == 1
        self.jobs.append(job)
        return 0

    def recv(self, shape, dtype, src: int, *, group=None) -> mx.array:
        self.receiving.set()
        self.release.wait(WAIT_SECONDS)
        if self.error is not None:
            raise self.error
        return mx.zeros(shape, dtype)


def test_a_job_is_held_to_the_stage_timeout_for_each_chunk_of_its_prompt():
    deadline = PrefillDeadline(StepWatchdog(2.5, print), chunk=512)
    assert [deadline.seconds(n) for n in (1, 512, 513, 1300, 1536)] == [2.5, 2.5, 5.0, 7.5, 7.5]
    with pytest.raises(ValueError, match="chunk must be >= 1 token, got 0"):
        PrefillDeadline(StepWatchdog(2.5, print), chunk=0)


def test_a_step_past_its_own_limit_is_reported():
    overruns: list[float] = []
    reported = threading.Event()

    def on_overrun(seconds: float) -> None:
        overruns.append(seconds)
        reported.set()

    watchdog = StepWatchdog(WAIT_SECONDS, on_overrun)
    with watchdog.step(0.05):
        assert reported.wait(WAIT_SECONDS)
    watchdog.close()
    assert len(overruns) == 1 and 0.05 <= overruns[0] < WAIT_SECONDS
    with pytest.raises(ValueError, match="limit must be > 0 seconds, got 0"), watchdog.step(0):
        pass


@pytest.fixture
def front(request, tiny_safetensors, monkeypatch):
    """A serving rank 0 whose engine prefills on the fake rank 1 under the stage timeout
    the test is parametrized with (seconds); yields (state, pair, fake rank, stderr)."""
    stage_timeout = request.param
    rank1 = FakePrefillRank()
    monkeypatch.setattr(disaggregate_front, "receive_ready", rank1.receive_ready)
    monkeypatch.setattr(disaggregate_front, "send_job", rank1.send_job)
    monkeypatch.setattr(mx.distributed, "recv", rank1.recv)
    loaded = load_model(tiny_safetensors)
    state = ServerState()
    pair = DisaggregatedRank(mx.distributed.init(), None, StageHealth())
    err = io.StringIO()
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_chunk=CHUNK),
        context_size=64,
        block_size=4,
        num_kv_blocks=64,
    )
    engine = Engine(
        loaded.model,
        config,
        make_remote_prefill=guard_prefill(pair, state, stage_timeout, CHUNK, err),
    )
    state.set_ready(ServingModel(loaded, engine, "tiny", 64))
    yield state, pair, rank1, err
    rank1.release.set()
    state.close(timeout=WAIT_SECONDS)


# A stage timeout the fake's answers never come near, and one a held answer overruns.
AMPLE = pytest.mark.parametrize("front", [WAIT_SECONDS], indirect=True)
SHORT = pytest.mark.parametrize("front", [0.1], indirect=True)


def _submit(
    state: ServerState, max_tokens: int = 4, sink: OutputQueue | None = None
) -> OutputQueue:
    sink = OutputQueue() if sink is None else sink
    request = EngineRequest(
        prompt_ids=PROMPT,
        sampling=SamplingParams(temperature=0.0),
        generation=GenerationConfig(context_size=64, max_tokens=max_tokens),
        detokenizer=_Silent(),
    )
    state.require_model().engine.submit([request], sink)
    return sink


class _Silent:
    def add_token(self, token_id: int) -> str:
        return ""

    def finalize(self) -> str:
        return ""


def _health(state: ServerState) -> tuple[int, dict]:
    app = create_app(state, ServerSettings())

    async def call():
        response = await app.test_client().get("/health")
        return response.status_code, await response.get_json()

    return asyncio.run(call())


@SHORT
def test_kv_that_does_not_arrive_in_time_degrades_the_server_naming_rank_1(front):
    state, pair, rank1, err = front
    sink = _submit(state)
    output = sink.get(timeout=WAIT_SECONDS)
    assert isinstance(output.error, EngineUnavailableError)
    assert "rank 1 did not return a prompt's KV within" in str(output.error)
    (job,) = rank1.jobs
    assert job is not None and len(job.token_ids) == len(PROMPT) - 1
    assert pair.health.fault.rank == 1
    status, body = _health(state)
    assert status == 503 and body["status"] == "degraded" and body["rank"] == 1
    assert "--stage-timeout per -ub chunk" in body["reason"]
    assert err.getvalue().startswith("mlxcel: error: rank 1 did not return a prompt's KV")


@AMPLE
def test_kv_that_arrives_in_time_is_used(front):
    state, pair, rank1, _ = front
    rank1.release.set()
    sink = _submit(state, max_tokens=3)
    tokens = []
    while not (output := sink.get(timeout=WAIT_SECONDS)).finished:
        tokens.append(output.token_id)
    assert output.error is None and len(tokens) + (output.token_id is not None) == 3
    assert pair.health.fault is None and _health(state)[0] == 200


@AMPLE
def test_a_failed_link_degrades_the_server_naming_rank_1(front):
    state, pair, rank1, _ = front
    rank1.error = RuntimeError("[ring] connection to a peer was lost")
    rank1.release.set()
    sink = _submit(state)
    output = sink.get(timeout=WAIT_SECONDS)
    assert "rank 1 cannot be reached: [ring] connection to a peer was lost" in str(output.error)
    assert pair.health.fault.rank == 1 and _health(state)[1]["rank"] == 1


@AMPLE
def test_rank_1_exiting_with_kv_in_flight_ends_the_request_with_its_exit_code(front):
    state, pair, rank1, _ = front
    sink = _submit(state)
    assert rank1.receiving.wait(WAIT_SECONDS)
    pair.health.report(StageFault(1, "exited with code -9"))
    output = sink.get(timeout=WAIT_SECONDS)
    assert "rank 1 exited with code -9" in str(output.error)
    status, body = _health(state)
    assert (status, body["rank"], body["reason"]) == (503, 1, "exited with code -9")


class _YieldingSink(OutputQueue):
    """An output queue whose `put` lets other threads run, as the server's does (it wakes
    the event loop through a pipe), so the engine thread can end concurrently with it."""

    def put(self, output: EngineOutput) -> None:
        time.sleep(0.01)
        super().put(output)


@AMPLE
def test_requests_queued_behind_kv_in_flight_end_with_the_error_naming_rank_1(front):
    state, pair, rank1, _ = front
    sinks = [_YieldingSink() for _ in range(4)]
    for sink in sinks:
        _submit(state, sink=sink)
    assert rank1.receiving.wait(WAIT_SECONDS)
    pair.health.report(StageFault(1, "exited with code -9"))
    for sink in sinks:
        output = sink.get(timeout=WAIT_SECONDS)
        assert isinstance(output.error, EngineUnavailableError)
        assert "rank 1 exited with code -9" in str(output.error)
