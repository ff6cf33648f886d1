"""Followers replay rank 0's engine exactly: the same forward passes over the same KV
contents, prefill chunks, batched decode and copy-on-write forks included. One process,
no group: rank 0's messages go through their encoding into a list the follower reads."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel_core.cache import KVCache
from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineRequest,
    OutputQueue,
    SchedulerConfig,
)
from mlxcel_core.generate import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_distributed import (
    KVPlan,
    Message,
    Sent,
    Shutdown,
    StageGuard,
    StageHealth,
    StageMetrics,
    StageReport,
    StepMessage,
    decode_message,
    encode_message,
    follow_steps,
    make_lockstep_runner_factory,
)
from mlxcel_distributed.lockstep import asks_for_reports

VOCAB = 97
TIMEOUT = 30.0


class ContextSumModel:
    """Stores each token id as its key; predicts (sum of the keys it attends to) mod VOCAB,
    so every prediction depends on the whole context held in the KV cache. Records the
    predictions of every forward pass."""

    def __init__(self) -> None:
        self.predictions: list[list[list[int]]] = []

    def make_cache(self) -> list[KVCache]:
        return [None]  # one layer; the engine passes its own caches

    def __call__(self, tokens: mx.array, cache: Sequence[KVCache], *, last_only=False):
        B, L = tokens.shape
        keys = tokens.astype(mx.float32).reshape(B, 1, L, 1)
        context, _ = cache[0].update_and_fetch(keys, keys)
        mask = cache[0].make_mask(L, return_array=True)
        visible = mx.broadcast_to(mask, (B, 1, L, context.shape[2]))
        sums = (mx.where(visible, context.reshape(B, 1, 1, -1), 0)).sum(-1).reshape(B, L)
        predicted = sums.astype(mx.int32) % VOCAB
        if last_only:
            predicted = predicted[:, -1:]
        self.predictions.append(predicted.tolist())
        return 10.0 * mx.eye(VOCAB)[predicted]


class ListChannel:
    """Rank 0 side: keeps every message as it would travel (encoded, decoded); follower
    side: reads them back in order and keeps the follower's reports."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.reports: list[StageReport] = []

    def send(self, message: Message) -> Sent:
        self.messages.append(decode_message(encode_message(message)))
        return Sent(0)

    def receive(self) -> Message:
        return self.messages.pop(0)

    def report(self, report: StageReport) -> None:
        self.reports.append(report)


def _request(prompt: Sequence[int], index: int = 0) -> EngineRequest:
    class Digits:
        def add_token(self, token_id: int) -> str:
            return f"{token_id} "

        def finalize(self) -> str:
            return ""

    return EngineRequest(
        prompt_ids=tuple(prompt),
        sampling=SamplingParams(temperature=0.0),
        generation=GenerationConfig(context_size=64, max_tokens=6),
        detokenizer=Digits(),
        index=index,
    )


def test_a_follower_runs_the_same_passes_over_the_same_kv_as_rank_0():
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, max_prefill_chunk=8),
        context_size=64,
        block_size=4,
        num_kv_blocks=64,
    )
    front_model, channel = ContextSumModel(), ListChannel()
    # Guarded, as a server's rank 0 is: the plan asks the follower for its reports.
    guard = StageGuard(StageHealth(), StageMetrics(2))
    factory = make_lockstep_runner_factory(channel, guard)
    engine = Engine(front_model, config, make_runner=factory)
    sinks = [OutputQueue(), OutputQueue()]
    try:
        # Two choices of one 6-token prompt share its partly filled second block, copied on
        # write; a 13-token prompt is prefilled in chunks beside their decode steps.
        engine.submit([_request(range(1, 7), 0), _request(range(1, 7), 1)], sinks[0])
        engine.submit([_request(range(20, 33))], sinks[1])
        for sink, count in zip(sinks, (2, 1), strict=True):
            finished = 0
            while finished < count:
                output = sink.get(timeout=TIMEOUT)
                assert output.error is None
                finished += output.finished
    finally:
        engine.shutdown(timeout=TIMEOUT)
    channel.send(Shutdown())
    assert channel.messages[0] == KVPlan((config.num_kv_blocks,), reports=True)
    steps = [m for m in channel.messages if isinstance(m, StepMessage)]
    assert any(step.copies for step in steps)
    assert any(len(step.rows) > 1 for step in steps)
    follower_model = ContextSumModel()
    assert follow_steps(follower_model, config, channel) == len(steps)
    assert follower_model.predictions == front_model.predictions
    # One report per step, numbered in order, each timing a step that ran.
    assert [report.steps for report in channel.reports] == list(range(1, len(steps) + 1))
    assert all(report.seconds > 0 and report.sent_bytes == 0 for report in channel.reports)


def test_rank_0_asks_for_reports_only_where_its_metrics_are_read():
    assert asks_for_reports(StageGuard(StageHealth(), StageMetrics(2)))
    assert not asks_for_reports(StageGuard(StageHealth(), StageMetrics(2), reports=False))
    assert not asks_for_reports(None)
