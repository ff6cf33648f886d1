"""Rank 0's measurements of the lockstep steps, read by the server's `/metrics`.

Only rank 0 measures: the followers' own step times would need a way back to rank 0 that
the step channel (rank 0 → others) does not give.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

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
    """

    group_size: int
    down_rank: int | None
    channel_seconds: Histogram
    forward_seconds: Histogram
    channel_bytes: int


class StageMetrics:
    """Step times and step-channel bytes on rank 0; safe to use from any thread.

    Args:
        group_size: ranks in the group (>= 1).
    """

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self._lock = threading.Lock()
        self._channel = HistogramCounter()
        self._forward = HistogramCounter()
        self._bytes = 0
        self._down_rank: int | None = None

    def record_step(self, channel_seconds: float, forward_seconds: float, nbytes: int) -> None:
        """Add one step: its send time and forward time (seconds) and the bytes sent."""
        with self._lock:
            self._channel.observe(channel_seconds)
            self._forward.observe(forward_seconds)
            self._bytes += nbytes

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
            )
