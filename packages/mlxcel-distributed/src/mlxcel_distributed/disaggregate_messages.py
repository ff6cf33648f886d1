"""The front → prefill rank link of disaggregated prefill: jobs as int32 arrays over
`mx.distributed` send/recv, and the prompt KV coming back as one flat array.

A job travels as a fixed header of `HEADER_INTS` ints (kind, sequence id, attempt, first
block, block count, token count) then, for a prefill, its token ids; a shutdown is a
header alone. The reply is `kv_transfer.pack_blocks` of the job's blocks, then one
float32: the seconds the prefill rank took computing them (for `/metrics`). Before any job,
the prefill rank sends one int saying it takes jobs: each job is held to a deadline from
its sending, which must not include the prefill rank's own start.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.engine import PrefillJob

HEADER_INTS = 6
_PREFILL = 1
_SHUTDOWN = 2
_READY = 3


def send_job(job: PrefillJob | None, peer: int, group: mx.distributed.Group) -> int:
    """Send a job (None: shutdown) to rank `peer`, blocking until it is sent.

    Returns:
        The bytes sent.
    """
    if job is None:
        header = _header(_SHUTDOWN, 0, 0, 0, 0, 0)
        mx.eval(mx.distributed.send(header, peer, group=group))
        return header.nbytes
    header = _header(
        _PREFILL, job.seq_id, job.attempt, job.first_block, job.num_blocks, len(job.token_ids)
    )
    tokens = mx.array(job.token_ids, dtype=mx.int32)
    mx.eval(mx.distributed.send(header, peer, group=group))
    mx.eval(mx.distributed.send(tokens, peer, group=group))
    return header.nbytes + tokens.nbytes


def receive_job(peer: int, group: mx.distributed.Group) -> PrefillJob | None:
    """The next job rank `peer` sends (None: shutdown), blocking until it arrives.

    Raises:
        ValueError: the header is of an unknown kind or describes no tokens.
    """
    header = mx.distributed.recv((HEADER_INTS,), mx.int32, peer, group=group).tolist()
    kind, seq_id, attempt, first_block, num_blocks, num_tokens = header
    if kind == _SHUTDOWN:
        return None
    if kind != _PREFILL or num_tokens < 1:
        raise ValueError(f"not a prefill job header: {header}")
    tokens = mx.distributed.recv((num_tokens,), mx.int32, peer, group=group).tolist()
    return PrefillJob(seq_id, attempt, tuple(tokens), first_block, num_blocks)


def send_kv(
    packed: mx.array, compute_seconds: float, peer: int, group: mx.distributed.Group
) -> None:
    """Send a job's packed KV to rank `peer`, then the time (seconds) this rank took
    computing it, blocking until both are sent."""
    mx.eval(mx.distributed.send(packed, peer, group=group))
    seconds = mx.array([compute_seconds], dtype=mx.float32)
    mx.eval(mx.distributed.send(seconds, peer, group=group))


def receive_compute_seconds(peer: int, group: mx.distributed.Group) -> float:
    """The time (seconds) rank `peer` took computing the KV it has just sent, blocking
    until it arrives."""
    (seconds,) = mx.distributed.recv((1,), mx.float32, peer, group=group).tolist()
    return seconds


def send_ready(peer: int, group: mx.distributed.Group) -> None:
    """Tell rank `peer` this rank takes jobs now, blocking until it is sent."""
    mx.eval(mx.distributed.send(_header(_READY), peer, group=group))


def receive_ready(peer: int, group: mx.distributed.Group) -> None:
    """Wait until rank `peer` says it takes jobs.

    Raises:
        ValueError: the message is not that.
    """
    (kind,) = mx.distributed.recv((1,), mx.int32, peer, group=group).tolist()
    if kind != _READY:
        raise ValueError(f"expected the prefill rank's ready signal, got {kind}")


def _header(*ints: int) -> mx.array:
    return mx.array(ints, dtype=mx.int32)
