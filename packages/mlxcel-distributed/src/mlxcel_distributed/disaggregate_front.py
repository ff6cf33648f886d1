"""The front's side of disaggregated prefill: the engine's `RemotePrefill` over a group.

The engine (on rank 0) submits jobs; one thread of their own sends each to the prefill
rank and waits for its KV, so the engine thread never blocks on the link and keeps
stepping its decode batch meanwhile. MLX allows this: the thread evaluates its sends and
receives on an MLX stream of its own (`thread_stream`), and a receive that waits does not
hold up the engine's stream. Jobs go one at a time, in submission order: the prefill rank
computes one prompt at a time anyway.

A receive whose peer hangs blocks for good (MLX cannot interrupt it), so each job can be
held to a deadline (`PrefillDeadline`) by a `StepWatchdog`, which reports the overrun
while the thread stays blocked. Each prompt's times and bytes go to a `PrefillMetrics`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine import PrefilledKV, PrefillJob, RemotePrefill, RemotePrefillFactory
from mlxcel_core.threads import thread_stream
from mlxcel_distributed.disaggregate_messages import (
    receive_compute_seconds,
    receive_ready,
    send_job,
)
from mlxcel_distributed.disaggregate_metrics import PrefillMetrics
from mlxcel_distributed.kv_transfer import BlockLayout, block_layout, unpack_blocks
from mlxcel_distributed.watchdog import StepWatchdog

PREFILL_RANK = 1


@dataclass(frozen=True)
class PrefillDeadline:
    """How long the prefill rank may take over one job, from its sending to its KV's
    arrival: the watchdog's timeout (the stage timeout) for each chunk of `chunk` tokens
    the prompt is prefilled in, so a limit that fits one engine step fits each chunk.

    The prefill rank computes only what its own prefix cache lacks, so a prompt it has
    partly seen has time to spare; the last chunk's share also covers the KV's transfer.

    Args:
        watchdog: holds each job to its limit and reports an overrun.
        chunk: the prefill chunk (tokens, >= 1), the engine's `max_prefill_chunk`.

    Raises:
        ValueError: `chunk` < 1.
    """

    watchdog: StepWatchdog
    chunk: int

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1 token, got {self.chunk}")

    def seconds(self, num_tokens: int) -> float:
        """The limit (seconds) of a job of `num_tokens` prompt tokens (>= 1)."""
        num_chunks = -(-num_tokens // self.chunk)
        return self.watchdog.timeout * num_chunks

    @contextmanager
    def watch(self, job: PrefillJob) -> Iterator[None]:
        """Hold the body to `job`'s limit."""
        with self.watchdog.step(self.seconds(len(job.token_ids))):
            yield


class PrefillClient(RemotePrefill):
    """Sends the engine's prefill jobs to the prefill rank and delivers their KV.

    Args:
        group: the group of the front (rank 0) and the prefill rank (rank 1).
        layout: the block layout of the front's KV storage, which the prefill rank shares.
        deliver: called on the client's thread with each job's KV.
        on_failure: called on the client's thread when the link fails; the client stops.
        metrics: where each prompt's times and bytes are recorded.
        deadline: holds each job to its limit; None waits for the KV however long it takes.
    """

    def __init__(
        self,
        group: mx.distributed.Group,
        layout: BlockLayout,
        deliver: Callable[[PrefilledKV], None],
        on_failure: Callable[[BaseException], None],
        metrics: PrefillMetrics,
        deadline: PrefillDeadline | None = None,
    ) -> None:
        self._group = group
        self._layout = layout
        self._deliver = deliver
        self._on_failure = on_failure
        self._metrics = metrics
        self._deadline = deadline
        self._jobs: queue.Queue[PrefillJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="mlxcel-prefill-link", daemon=True)
        self._thread.start()

    def submit(self, job: PrefillJob) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        """Send the prefill rank its shutdown once the jobs queued before it are done, and
        wait for the client's thread to end."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        with thread_stream():
            while True:
                job = self._jobs.get()
                try:
                    if job is None:
                        send_job(None, PREFILL_RANK, self._group)
                        return
                    with self._watching(job):
                        kv = self._prefill(job)
                    self._deliver(kv)
                # A failed link (a dead rank, a broken socket) leaves no way to prefill.
                except Exception as error:
                    self._on_failure(error)
                    return

    def _watching(self, job: PrefillJob) -> AbstractContextManager[None]:
        return nullcontext() if self._deadline is None else self._deadline.watch(job)

    def _prefill(self, job: PrefillJob) -> PrefilledKV:
        """Send `job`, receive its KV and record both."""
        start = time.perf_counter()
        self._metrics.record_job(send_job(job, PREFILL_RANK, self._group))
        size = self._layout.num_elements(job.num_blocks)
        flat = mx.distributed.recv((size,), self._layout.dtype, PREFILL_RANK, group=self._group)
        # The receive waits alone: MLX throttles the tasks in flight over all streams
        # together, and the slicing tasks queued behind a waiting receive would hold the
        # engine thread's evaluations back until the KV arrived.
        mx.eval(flat)
        compute_seconds = receive_compute_seconds(PREFILL_RANK, self._group)
        contents = unpack_blocks(flat, self._layout, job.num_blocks)
        mx.eval(contents)
        self._metrics.record_prefill(time.perf_counter() - start, compute_seconds, flat.nbytes)
        return PrefilledKV(job.seq_id, job.attempt, tuple(contents))


def make_prefill_client_factory(
    group: mx.distributed.Group,
    on_failure: Callable[[BaseException], None],
    metrics: PrefillMetrics,
    deadline: PrefillDeadline | None = None,
) -> RemotePrefillFactory:
    """The `Engine(make_remote_prefill=...)` factory of the front: it waits until the
    prefill rank takes jobs (so the engine, and the server, are ready only then), and
    returns a `PrefillClient` reporting a failed link to `on_failure`, each prompt's times
    and bytes to `metrics`, its jobs held to `deadline` (None: none).

    The factory raises `ValueError` for a KV storage whose pools differ in dtype (a
    quantized cache type), or a first message that is not the prefill rank's ready signal;
    and MLX's `RuntimeError` when the link fails meanwhile, after reporting it to
    `on_failure` on the calling thread.
    """

    def make_remote_prefill(
        storage: PagedKVStorage, deliver: Callable[[PrefilledKV], None]
    ) -> RemotePrefill:
        layout = block_layout(storage)
        try:
            receive_ready(PREFILL_RANK, group)
        except RuntimeError as error:
            on_failure(error)
            raise
        return PrefillClient(group, layout, deliver, on_failure, metrics, deadline)

    return make_remote_prefill
