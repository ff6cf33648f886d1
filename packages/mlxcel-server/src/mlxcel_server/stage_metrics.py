"""`/metrics` for a model split over ranks (`--tp`, `--pp`): which ranks serve, rank 0's
step times and the bytes it sends over the step channel."""

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
    from mlxcel_distributed import Histogram, StageMetrics


def _buckets(histogram: Histogram) -> list[tuple[str, int]]:
    return [
        (str(bound) if bound != float("inf") else "+Inf", count)
        for bound, count in histogram.buckets
    ]


class StageCollector(Collector):
    """Reads rank 0's `StageMetrics` at each scrape.

    Exposes `mlxcel:distributed_ranks{role, rank}` (1 while the rank serves, 0 once it is
    at fault; role `front` for rank 0, `follower` for the others),
    `mlxcel:distributed_degraded` (1 once a rank is at fault, even one rank 0 cannot name),
    the histograms `mlxcel:step_channel_seconds` (sending each step to the other ranks) and
    `mlxcel:step_forward_seconds` (each step's sharded forward pass, collectives included),
    and the counter `mlxcel:step_channel_bytes` (bytes rank 0 sent over the step channel).
    """

    def __init__(self, metrics: StageMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snapshot = self._metrics.snapshot()
        ranks = GaugeMetricFamily(
            "mlxcel:distributed_ranks",
            "Ranks of the group by role: 1 while serving, 0 once at fault.",
            labels=("role", "rank"),
        )
        for rank in range(snapshot.group_size):
            role = "front" if rank == 0 else "follower"
            ranks.add_metric((role, str(rank)), 0 if rank == snapshot.down_rank else 1)
        yield ranks
        yield GaugeMetricFamily(
            "mlxcel:distributed_degraded",
            "1 once a rank of the group is gone or hung; the server then answers 503.",
            0 if snapshot.down_rank is None else 1,
        )
        for name, histogram, text in (
            (
                "mlxcel:step_channel_seconds",
                snapshot.channel_seconds,
                "Rank 0's time sending each engine step to the other ranks.",
            ),
            (
                "mlxcel:step_forward_seconds",
                snapshot.forward_seconds,
                "Rank 0's time running each engine step's sharded forward pass.",
            ),
        ):
            yield HistogramMetricFamily(
                name, text, buckets=_buckets(histogram), sum_value=histogram.total
            )
        yield CounterMetricFamily(
            "mlxcel:step_channel_bytes",
            "Bytes rank 0 sent over the step channel.",
            snapshot.channel_bytes,
        )
