"""`/metrics` under `--disaggregate`, in-process on the tiny model: rank 0's real engine
and prefill client, wired as `mlxcel serve` wires them, and the real prefill rank's loop
(`serve_prefills`) on a thread, the two joined by a loopback in place of `mx.distributed`'s
send and receive, which carries the real messages. After N remote prefills the counters
say N and the KV bytes are the blocks' real size; a job's bytes count once it is sent,
whether or not its KV arrives; once the link to rank 1 is lost, rank 1's gauge reads 0."""

from __future__ import annotations

import asyncio
import contextlib
import io
import queue
import threading
from collections.abc import Iterator

import mlx.core as mx
import pytest

from mlxcel.distributed.disaggregate_flags import DisaggregatedRank
from mlxcel.distributed.stage_faults import guard_prefill
from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineRequest,
    OutputQueue,
    SchedulerConfig,
)
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.threads import thread_stream
from mlxcel_distributed import StageHealth, serve_prefills
from mlxcel_models.loading.loader import load_model
from mlxcel_server import ServerSettings, ServerState, ServingModel, create_app

from factories import TinyConfig
from metric_samples import metric_samples

# Bounds every wait on another thread, so a broken path fails instead of hanging.
WAIT_SECONDS = 10.0
BLOCK_SIZE = 4
CONTEXT_SIZE = 64
# No two share a leading block, so each prompt's KV crosses the link whole: all but its
# last token, in ceil((T - 1) / BLOCK_SIZE) blocks.
PROMPTS = [tuple(range(40, 61)), tuple(range(70, 73)), tuple(range(100, 117))]
LOST = "[ring] connection to a peer was lost"


class LoopbackGroup:
    """One rank's end of a two-rank group whose messages stay in this process."""

    def __init__(self, rank: int) -> None:
        self._rank = rank

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return 2


class Loopback:
    """`mx.distributed.send` and `recv` between two threads, a queue per direction; a
    receive gets the array sent, which must have the shape and dtype it asks for. Once
    `cut`, sends and receives raise as the ring backend's do for a lost peer; after
    `cut_before_reply`, rank 0's next receive cuts the link."""

    def __init__(self) -> None:
        self._queues = {(0, 1): queue.Queue(), (1, 0): queue.Queue()}
        self._cut = False
        self._cut_before_reply = False

    def send(self, array: mx.array, dst: int, *, group: LoopbackGroup) -> mx.array:
        if self._cut:
            raise RuntimeError(LOST)
        mx.eval(array)
        self._queues[(group.rank(), dst)].put(array)
        return array

    def recv(self, shape, dtype, src: int, *, group: LoopbackGroup) -> mx.array:
        if self._cut_before_reply and group.rank() == 0:
            self.cut()
        array = self._queues[(src, group.rank())].get(timeout=WAIT_SECONDS)
        if array is None:
            raise RuntimeError(LOST)
        assert (array.shape, array.dtype) == (tuple(shape), dtype)
        return array

    def cut(self) -> None:
        self._cut = True
        for waiting in self._queues.values():
            waiting.put(None)

    def cut_before_reply(self) -> None:
        self._cut_before_reply = True


def make_config() -> EngineConfig:
    return EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_chunk=8),
        context_size=CONTEXT_SIZE,
        block_size=BLOCK_SIZE,
        num_kv_blocks=64,
    )


@pytest.fixture
def pair(tiny_safetensors, monkeypatch) -> Iterator[tuple[ServerState, Loopback]]:
    """A ready rank 0 whose engine prefills on rank 1 over the loopback, as `mlxcel serve
    --disaggregate --metrics` sets it up; yields (state, loopback)."""
    link = Loopback()
    monkeypatch.setattr(mx.distributed, "send", link.send)
    monkeypatch.setattr(mx.distributed, "recv", link.recv)
    loaded = load_model(tiny_safetensors)
    config = make_config()

    def prefill_rank() -> None:
        # The cut link ends it with the ring backend's error.
        with thread_stream(), contextlib.suppress(RuntimeError):
            serve_prefills(loaded.model, config, LoopbackGroup(1))

    rank1 = threading.Thread(target=prefill_rank, daemon=True)
    rank1.start()
    state = ServerState()
    front = DisaggregatedRank(LoopbackGroup(0), None, StageHealth())
    make_remote_prefill = guard_prefill(front, state, WAIT_SECONDS, 8, io.StringIO())
    engine = Engine(loaded.model, config, make_remote_prefill=make_remote_prefill)
    state.set_ready(ServingModel(loaded, engine, "tiny", CONTEXT_SIZE))
    yield state, link
    state.close(timeout=WAIT_SECONDS)
    rank1.join(WAIT_SECONDS)


class _Silent:
    def add_token(self, token_id: int) -> str:
        return ""

    def finalize(self) -> str:
        return ""


def _generate(state: ServerState, prompt: tuple[int, ...]) -> Exception | None:
    """Run `prompt` greedily for 3 tokens; the error it ends with, if any."""
    sink = OutputQueue()
    request = EngineRequest(
        prompt_ids=prompt,
        sampling=SamplingParams(temperature=0.0),
        generation=GenerationConfig(context_size=CONTEXT_SIZE, max_tokens=3),
        detokenizer=_Silent(),
    )
    state.require_model().engine.submit([request], sink)
    while not (output := sink.get(timeout=WAIT_SECONDS)).finished:
        pass
    return output.error


def _scrape(state: ServerState) -> dict[str, float]:
    """`GET /metrics` as {sample name with its labels: value}."""
    app = create_app(state, ServerSettings(endpoint_metrics=True))

    async def call() -> str:
        response = await app.test_client().get("/metrics")
        assert response.status_code == 200
        return (await response.get_data()).decode()

    return metric_samples(asyncio.run(call()))


def _job_bytes(prompt: tuple[int, ...]) -> int:
    """The bytes of a prompt's job: a header of 6 int32 and its token ids but the last,
    int32 each."""
    return 4 * (6 + len(prompt) - 1)


def _kv_bytes(prompt: tuple[int, ...]) -> int:
    """The bytes of a prompt's KV blocks on the tiny float32 model, from its shape."""
    model = TinyConfig()
    num_blocks = -(-(len(prompt) - 1) // BLOCK_SIZE)
    per_position = model.num_layers * 2 * model.num_kv_heads * model.head_dim * 4
    return num_blocks * BLOCK_SIZE * per_position


def test_metrics_count_each_remote_prefill_and_its_kv_bytes(pair):
    state, _ = pair
    before = _scrape(state)
    assert before["mlxcel:remote_prefills_total"] == 0
    for prompt in PROMPTS:
        assert _generate(state, prompt) is None
    samples = _scrape(state)
    assert samples['mlxcel:distributed_ranks{rank="0",role="front"}'] == 1
    assert samples['mlxcel:distributed_ranks{rank="1",role="prefill"}'] == 1
    assert samples["mlxcel:distributed_degraded"] == 0
    assert samples["mlxcel:remote_prefills_total"] == len(PROMPTS)
    assert samples["mlxcel:kv_transfer_bytes_total"] == sum(_kv_bytes(p) for p in PROMPTS)
    job_bytes = sum(_job_bytes(p) for p in PROMPTS)
    assert samples["mlxcel:remote_prefill_job_bytes_total"] == job_bytes
    for name in ("mlxcel:remote_prefill_seconds", "mlxcel:remote_prefill_compute_seconds"):
        assert samples[f"{name}_count"] == len(PROMPTS)
        assert samples[f'{name}_bucket{{le="+Inf"}}'] == len(PROMPTS)
    # Rank 1's compute lies within the front's wait for it.
    compute = samples["mlxcel:remote_prefill_compute_seconds_sum"]
    assert 0 < compute <= samples["mlxcel:remote_prefill_seconds_sum"]


def test_the_prefill_rank_reads_0_once_its_link_is_lost(pair):
    state, link = pair
    assert _generate(state, PROMPTS[0]) is None
    link.cut()
    assert "rank 1 cannot be reached" in str(_generate(state, PROMPTS[2]))
    samples = _scrape(state)
    assert samples['mlxcel:distributed_ranks{rank="0",role="front"}'] == 1
    assert samples['mlxcel:distributed_ranks{rank="1",role="prefill"}'] == 0
    assert samples["mlxcel:distributed_degraded"] == 1
    assert samples["mlxcel:remote_prefills_total"] == 1
    assert samples["mlxcel:kv_transfer_bytes_total"] == _kv_bytes(PROMPTS[0])
    # The job the lost link refused to send counts no bytes.
    assert samples["mlxcel:remote_prefill_job_bytes_total"] == _job_bytes(PROMPTS[0])


def test_a_job_sent_whose_kv_never_arrives_counts_its_bytes(pair):
    state, link = pair
    assert _generate(state, PROMPTS[0]) is None
    link.cut_before_reply()
    assert "rank 1 cannot be reached" in str(_generate(state, PROMPTS[2]))
    samples = _scrape(state)
    assert samples["mlxcel:remote_prefills_total"] == 1
    assert samples["mlxcel:kv_transfer_bytes_total"] == _kv_bytes(PROMPTS[0])
    sent = _job_bytes(PROMPTS[0]) + _job_bytes(PROMPTS[2])
    assert samples["mlxcel:remote_prefill_job_bytes_total"] == sent
