"""`/metrics` for a model served by several ranks: which ranks serve what, and rank 0's
measurements of them: for a model split over ranks (`--tp`, `--pp`) its step times, the
bytes it sends over the step channel, and every rank's own step times (and under `--pp`
bytes sent on) as the ranks report them; for disaggregated prefill (`--disaggregate`)
each remote prefill's times and the bytes crossing the link."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from mlxcel_distributed import Histogram, PrefillMetrics, StageMetrics

# The prefill rank of `--disaggregate`.
_PREFILL_RANK = 1


def _buckets(histogram: Histogram) -> list[tuple[str, int]]:
    return [
        (str(bound) if bound != float("inf") else "+Inf", count)
        for bound, count in histogram.buckets
    ]


def _histogram(name: str, text: str, histogram: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, text, buckets=_buckets(histogram), sum_value=histogram.total)


def _ranks(roles: list[str], down_rank: int | None) -> Iterator[Metric]:
    """`mlxcel:distributed_ranks` for ranks with `roles` (rank 0's first), and
    `mlxcel:distributed_degraded`, with `down_rank` at fault (-1: one rank 0 cannot name;
    None: none)."""
    ranks = GaugeMetricFamily(
        "mlxcel:distributed_ranks",
        "Ranks of the group by role: 1 while serving, 0 once at fault.",
        labels=("role", "rank"),
    )
    for rank, role in enumerate(roles):
        ranks.add_metric((role, str(rank)), 0 if rank == down_rank else 1)
    yield ranks
    yield GaugeMetricFamily(
        "mlxcel:distributed_degraded",
        "1 once a rank of the group is gone or hung; the server then answers 503.",
        0 if down_rank is None else 1,
    )


class StageCollector(Collector):
    """Reads rank 0's `StageMetrics` at each scrape.

    Exposes `mlxcel:distributed_ranks{role, rank}` (1 while the rank serves, 0 once it is
    at fault; role `front` for rank 0, `follower` for the others),
    `mlxcel:distributed_degraded` (1 once a rank is at fault, even one rank 0 cannot name),
    the histograms `mlxcel:step_channel_seconds` (sending each step to the other ranks) and
    `mlxcel:step_forward_seconds` (each step's sharded forward pass, collectives included),
    the counter `mlxcel:step_channel_bytes` (bytes rank 0 sent over the step channel), the
    histogram `mlxcel:stage_step_seconds{rank}` (each rank's own time on each step, as it
    reports it; see `StageReport`) and, for a pipeline, the counter
    `mlxcel:stage_sent_bytes_total{rank}` (the hidden states or logits each rank sent on).
    """

    def __init__(self, metrics: StageMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snapshot = self._metrics.snapshot()
        roles = ["front"] + ["follower"] * (snapshot.group_size - 1)
        yield from _ranks(roles, snapshot.down_rank)
        yield _histogram(
            "mlxcel:step_channel_seconds",
            "Rank 0's time sending each engine step to the other ranks.",
            snapshot.channel_seconds,
        )
        yield _histogram(
            "mlxcel:step_forward_seconds",
            "Rank 0's time running each engine step's sharded forward pass.",
            snapshot.forward_seconds,
        )
        yield CounterMetricFamily(
            "mlxcel:step_channel_bytes",
            "Bytes rank 0 sent over the step channel.",
            snapshot.channel_bytes,
        )
        stage_seconds = HistogramMetricFamily(
            "mlxcel:stage_step_seconds",
            "Each rank's own time on each engine step, as the rank reports it.",
            labels=("rank",),
        )
        for rank, histogram in snapshot.stage_seconds.items():
            stage_seconds.add_metric((str(rank),), _buckets(histogram), histogram.total)
        yield stage_seconds
        if snapshot.stage_sent_bytes is not None:
            sent = CounterMetricFamily(
                "mlxcel:stage_sent_bytes",
                "Bytes each pipeline stage sent on: hidden states to the next stage, or "
                "the last stage's logits to rank 0.",
                labels=("rank",),
            )
            for rank, nbytes in snapshot.stage_sent_bytes.items():
                sent.add_metric((str(rank),), nbytes)
            yield sent


class PrefillCollector(Collector):
    """Reads rank 0's `PrefillMetrics` at each scrape (`--disaggregate`).

    Exposes `mlxcel:distributed_ranks{role, rank}` (role `front` for rank 0, which decodes,
    `prefill` for rank 1; 1 while it serves, 0 once at fault), `mlxcel:distributed_degraded`,
    the histograms `mlxcel:remote_prefill_seconds` (from sending a prompt's job to having
    its KV) and `mlxcel:remote_prefill_compute_seconds` (rank 1's own time computing it, as
    rank 1 reports it), and the counters `mlxcel:remote_prefills` (prompts prefilled on
    rank 1), `mlxcel:remote_prefill_job_bytes` (jobs sent) and
    `mlxcel:kv_transfer_bytes` (prompt KV received).
    """

    def __init__(self, metrics: PrefillMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snapshot = self._metrics.snapshot()
        down_rank = _PREFILL_RANK if snapshot.prefill_rank_down else None
        yield from _ranks(["front", "prefill"], down_rank)
        yield _histogram(
            "mlxcel:remote_prefill_seconds",
            "Rank 0's time from sending a prompt to the prefill rank to having its KV.",
            snapshot.remote_seconds,
        )
        yield _histogram(
            "mlxcel:remote_prefill_compute_seconds",
            "The prefill rank's own time computing each prompt's KV, as it reports it.",
            snapshot.compute_seconds,
        )
        yield CounterMetricFamily(
            "mlxcel:remote_prefills",
            "Prompts whose KV the prefill rank computed and returned.",
            snapshot.num_prefills,
        )
        yield CounterMetricFamily(
            "mlxcel:remote_prefill_job_bytes",
            "Bytes rank 0 sent to the prefill rank: prompts' token ids and job headers.",
            snapshot.job_bytes,
        )
        yield CounterMetricFamily(
            "mlxcel:kv_transfer_bytes",
            "Bytes of prompt KV rank 0 received from the prefill rank.",
            snapshot.kv_bytes,
        )
