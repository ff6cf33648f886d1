"""Rank 0's measurements of the lockstep steps, and every rank's own step times and bytes
sent as they report them (`stage_reports`), read by the server's `/metrics`."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from mlxcel_distributed.stage_reports import StageReport

# Upper bounds (seconds) of the step-time histograms' buckets; the last bucket is +Inf.
STEP_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Histogram:
    """Cumulative counts per bucket, as Prometheus reports them.

    Attributes:
        buckets: (upper bound in seconds, observations at or below it), `+Inf` last.
        total: the sum of the observations (seconds).
    """

    buckets: tuple[tuple[float, int], ...]
    total: float


class HistogramCounter:
    """Observations (seconds) counted into buckets; not thread-safe: its owner locks.

    Args:
        bounds: the buckets' upper bounds (seconds, ascending); `+Inf` is added last.
    """

    def __init__(self, bounds: tuple[float, ...] = STEP_SECONDS_BUCKETS) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._total = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, seconds)] += 1
        self._total += seconds

    def snapshot(self) -> Histogram:
        bounds = (*self._bounds, float("inf"))
        running, buckets = 0, []
        for bound, count in zip(bounds, self._counts, strict=True):
            running += count
            buckets.append((bound, running))
        return Histogram(tuple(buckets), self._total)


@dataclass(frozen=True)
class StageMetricsSnapshot:
    """The measurements at one moment.

    Attributes:
        group_size: ranks in the group; rank 0 is the front, the others follow it.
        down_rank: the rank at fault, -1 when the fault names none, None while healthy.
        channel_seconds: time rank 0 spent sending each step over the step channel.
        forward_seconds: time of each step's sharded forward pass on rank 0 (collectives
            included), until its logits and KV writes are evaluated.
        channel_bytes: bytes rank 0 has sent over the step channel.
        stage_seconds: per rank, its own time on each step it reported (`StageReport`);
            a rank that has reported nothing yet is left out.
        stage_sent_bytes: per rank, the bytes it reported sending to the next stage; None
            for a group whose ranks send none (tensor parallel).
    """

    group_size: int
    down_rank: int | None
    channel_seconds: Histogram
    forward_seconds: Histogram
    channel_bytes: int
    stage_seconds: dict[int, Histogram]
    stage_sent_bytes: dict[int, int] | None


class StageMetrics:
    """Step times and step-channel bytes on rank 0, and each rank's reports; safe to use
    from any thread.

    Args:
        group_size: ranks in the group (>= 1).
        stages_send: whether the ranks send their outputs on (a pipeline's stages), so
            that their bytes sent are counted.
    """

    def __init__(self, group_size: int, *, stages_send: bool = False) -> None:
        self.group_size = group_size
        self._lock = threading.Lock()
        self._channel = HistogramCounter()
        self._forward = HistogramCounter()
        self._bytes = 0
        self._down_rank: int | None = None
        self._stages_send = stages_send
        self._stage_steps = [0] * group_size
        self._stage_seconds = [HistogramCounter() for _ in range(group_size)]
        self._stage_sent_bytes = [0] * group_size

    def record_step(self, channel_seconds: float, forward_seconds: float, nbytes: int) -> None:
        """Add one step: its send time and forward time (seconds) and the bytes sent."""
        with self._lock:
            self._channel.observe(channel_seconds)
            self._forward.observe(forward_seconds)
            self._bytes += nbytes

    def record_reports(self, reports: Mapping[int, StageReport]) -> None:
        """Add each rank's report (rank 0's own included) of a step not recorded yet; a
        report of a step already recorded (the same `steps`), or of a rank outside the
        group, is skipped."""
        with self._lock:
            for rank, report in reports.items():
                if not 0 <= rank < self.group_size or report.steps <= self._stage_steps[rank]:
                    continue
                self._stage_steps[rank] = report.steps
                self._stage_seconds[rank].observe(report.seconds)
                self._stage_sent_bytes[rank] += report.sent_bytes

    def record_down(self, rank: int | None) -> None:
        """Mark `rank` (None: one rank 0 cannot name) as no longer serving."""
        with self._lock:
            self._down_rank = -1 if rank is None else rank

    def snapshot(self) -> StageMetricsSnapshot:
        with self._lock:
            return StageMetricsSnapshot(
                self.group_size,
                self._down_rank,
                self._channel.snapshot(),
                self._forward.snapshot(),
                self._bytes,
                {
                    rank: histogram.snapshot()
                    for rank, histogram in enumerate(self._stage_seconds)
                    if self._stage_steps[rank] > 0
                },
                dict(enumerate(self._stage_sent_bytes)) if self._stages_send else None,
            )
