"""Rank 0's measurements of disaggregated prefill, read by the server's `/metrics`: each
remote prefill's time as the front sees it and as the prefill rank reports it, the bytes
crossing the link, and whether the prefill rank still serves."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from mlxcel_distributed.stage_metrics import Histogram, HistogramCounter

# Upper bounds (seconds) of the prefill-time histograms' buckets; the last bucket is +Inf.
# A prompt of a few thousand tokens takes minutes on a CPU, well under a second on a GPU.
PREFILL_SECONDS_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


@dataclass(frozen=True)
class PrefillMetricsSnapshot:
    """The measurements at one moment.

    Attributes:
        prefill_rank_down: whether the prefill rank is at fault.
        num_prefills: prompts whose KV the prefill rank returned.
        remote_seconds: per prompt, the front's time from sending its job to having its
            KV received and unpacked for the engine: the link both ways and the prefill
            rank's work, not the job's wait in the front's queue of jobs.
        compute_seconds: per prompt, the prefill rank's own time computing its KV and
            reading its blocks, as it reports it with the KV.
        job_bytes: bytes the front sent to the prefill rank (jobs' headers and token ids),
            counted as each job is sent, so a job whose KV never arrived counts too.
        kv_bytes: bytes of prompt KV the front received.
    """

    prefill_rank_down: bool
    num_prefills: int
    remote_seconds: Histogram
    compute_seconds: Histogram
    job_bytes: int
    kv_bytes: int


class PrefillMetrics:
    """Remote prefills' times and bytes on rank 0; safe to use from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._remote = HistogramCounter(PREFILL_SECONDS_BUCKETS)
        self._compute = HistogramCounter(PREFILL_SECONDS_BUCKETS)
        self._num_prefills = 0
        self._job_bytes = 0
        self._kv_bytes = 0
        self._down = False

    def record_job(self, job_bytes: int) -> None:
        """Add one job sent to the prefill rank, of `job_bytes` bytes, whether or not its
        KV ever arrives."""
        with self._lock:
            self._job_bytes += job_bytes

    def record_prefill(self, remote_seconds: float, compute_seconds: float, kv_bytes: int) -> None:
        """Add one prompt whose KV arrived: the front's and the prefill rank's times
        (seconds), and the bytes of its KV."""
        with self._lock:
            self._remote.observe(remote_seconds)
            self._compute.observe(compute_seconds)
            self._num_prefills += 1
            self._kv_bytes += kv_bytes

    def record_down(self) -> None:
        """Mark the prefill rank as no longer serving."""
        with self._lock:
            self._down = True

    def snapshot(self) -> PrefillMetricsSnapshot:
        with self._lock:
            return PrefillMetricsSnapshot(
                self._down,
                self._num_prefills,
                self._remote.snapshot(),
                self._compute.snapshot(),
                self._job_bytes,
                self._kv_bytes,
            )
