"""The front's side of disaggregated prefill: the engine's `RemotePrefill` over a group.

The engine (on rank 0) submits jobs; one thread of their own sends each to the prefill
rank and waits for its KV, so the engine thread never blocks on the link and keeps
stepping its decode batch meanwhile. MLX allows this: the thread evaluates its sends and
receives on an MLX stream of its own (`thread_stream`), and a receive that waits does not
hold up the engine's stream. Jobs go one at a time, in submission order: the prefill rank
computes one prompt at a time anyway.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import mlx.core as mx

from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine import PrefilledKV, PrefillJob, RemotePrefill, RemotePrefillFactory
from mlxcel_core.threads import thread_stream
from mlxcel_distributed.disaggregate_messages import send_job
from mlxcel_distributed.kv_transfer import BlockLayout, block_layout, unpack_blocks

logger = logging.getLogger(__name__)

PREFILL_RANK = 1


class PrefillClient(RemotePrefill):
    """Sends the engine's prefill jobs to the prefill rank and delivers their KV.

    Args:
        group: the group of the front (rank 0) and the prefill rank (rank 1).
        layout: the block layout of the front's KV storage, which the prefill rank shares.
        deliver: called on the client's thread with each job's KV.
        on_failure: called on the client's thread when the link fails; the client stops.
    """

    def __init__(
        self,
        group: mx.distributed.Group,
        layout: BlockLayout,
        deliver: Callable[[PrefilledKV], None],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self._group = group
        self._layout = layout
        self._deliver = deliver
        self._on_failure = on_failure
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
                    send_job(job, PREFILL_RANK, self._group)
                    if job is None:
                        return
                    self._deliver(self._receive(job))
                # A failed link (a dead rank, a broken socket) leaves no way to prefill.
                except Exception as error:
                    self._on_failure(error)
                    return

    def _receive(self, job: PrefillJob) -> PrefilledKV:
        size = self._layout.num_elements(job.num_blocks)
        flat = mx.distributed.recv((size,), self._layout.dtype, PREFILL_RANK, group=self._group)
        # The receive waits alone: MLX throttles the tasks in flight over all streams
        # together, and the slicing tasks queued behind a waiting receive would hold the
        # engine thread's evaluations back until the KV arrived.
        mx.eval(flat)
        contents = unpack_blocks(flat, self._layout, job.num_blocks)
        mx.eval(contents)
        return PrefilledKV(job.seq_id, job.attempt, tuple(contents))


def make_prefill_client_factory(
    group: mx.distributed.Group, on_failure: Callable[[BaseException], None]
) -> RemotePrefillFactory:
    """The `Engine(make_remote_prefill=...)` factory of the front.

    The factory raises `ValueError` for a KV storage whose pools differ in dtype (a
    quantized cache type).
    """

    def make_remote_prefill(
        storage: PagedKVStorage, deliver: Callable[[PrefilledKV], None]
    ) -> RemotePrefill:
        return PrefillClient(group, block_layout(storage), deliver, on_failure)

    return make_remote_prefill
