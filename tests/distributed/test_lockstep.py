"""Followers replay rank 0's engine exactly: the same forward passes over the same KV
contents, prefill chunks, batched decode and copy-on-write forks included. One process,
no group: rank 0's messages go through their encoding into a list the follower reads."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel_core.cache import KVCache
from mlxcel_core.cache.layout import CacheLayout, LayerCacheKind
from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineRequest,
    OutputQueue,
    SchedulerConfig,
)
from mlxcel_core.request import GenerationConfig
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


WINDOW = 5


class WindowedContextSumModel(ContextSumModel):
    """Two layers, the first reading the last `WINDOW` positions only, the second all of
    them: predicts (window sum + whole sum) mod VOCAB, so it needs both block groups."""

    @property
    def cache_layout(self) -> CacheLayout:
        return CacheLayout.of(
            [[LayerCacheKind.sliding_window(WINDOW)], [LayerCacheKind.attention()]]
        )

    def make_cache(self) -> list[KVCache]:
        return [None, None]  # the engine passes its own caches

    def __call__(self, tokens: mx.array, cache: Sequence[KVCache], *, last_only=False):
        B, L = tokens.shape
        keys = tokens.astype(mx.float32).reshape(B, 1, L, 1)
        sums = []
        for layer, window in ((cache[0], WINDOW), (cache[1], None)):
            context, _ = layer.update_and_fetch(keys, keys)
            mask = layer.make_mask(L, return_array=True, window_size=window)
            visible = mx.broadcast_to(mask, (B, 1, L, context.shape[2]))
            sums.append(mx.where(visible, context.reshape(B, 1, 1, -1), 0).sum(-1).reshape(B, L))
        predicted = (sums[0] + sums[1]).astype(mx.int32) % VOCAB
        if last_only:
            predicted = predicted[:, -1:]
        self.predictions.append(predicted.tolist())
        return 10.0 * mx.eye(VOCAB)[predicted]


def windowed_sums(prompt: Sequence[int], num_tokens: int) -> list[int]:
    """The tokens `WindowedContextSumModel` generates after `prompt`."""
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append((sum(tokens[-WINDOW:]) + sum(tokens)) % VOCAB)
    return tokens[len(prompt) :]


def test_a_follower_replays_a_model_with_a_window_group():
    """Rank 0 keeps the windowed layer's blocks in a group of its own (freed behind the
    window); the plan gives the follower the same groups and each step both groups'
    tables."""
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, max_prefill_chunk=8),
        context_size=64,
        block_size=4,
        num_kv_blocks=64,
    )
    front_model, channel = WindowedContextSumModel(), ListChannel()
    engine = Engine(front_model, config, make_runner=make_lockstep_runner_factory(channel))
    prompts = [tuple(range(1, 7)), tuple(range(1, 7)), tuple(range(20, 50))]
    tokens: list[list[int]] = [[], [], []]
    try:
        sinks = [OutputQueue(), OutputQueue()]
        engine.submit([_request(prompts[0], 0), _request(prompts[1], 1)], sinks[0])
        engine.submit([_request(prompts[2])], sinks[1])
        for sink, offset, count in zip(sinks, (0, 2), (2, 1), strict=True):
            finished = 0
            while finished < count:
                output = sink.get(timeout=TIMEOUT)
                assert output.error is None
                if output.token_id is not None:
                    tokens[offset + output.index].append(output.token_id)
                finished += output.finished
    finally:
        engine.shutdown(timeout=TIMEOUT)
    channel.send(Shutdown())
    assert tokens == [windowed_sums(prompt, 6) for prompt in prompts]
    plan = channel.messages[0]
    assert isinstance(plan, KVPlan) and plan.windows == (None, WINDOW)
    steps = [m for m in channel.messages if isinstance(m, StepMessage)]
    # The 30-token prompt's windowed table lost blocks behind the window.
    assert any(0 in row.block_tables[1][1:] for step in steps for row in step.rows)
    follower_model = WindowedContextSumModel()
    assert follow_steps(follower_model, config, channel) == len(steps)
    assert follower_model.predictions == front_model.predictions


def test_rank_0_asks_for_reports_only_where_its_metrics_are_read():
    assert asks_for_reports(StageGuard(StageHealth(), StageMetrics(2)))
    assert not asks_for_reports(StageGuard(StageHealth(), StageMetrics(2), reports=False))
    assert not asks_for_reports(None)
