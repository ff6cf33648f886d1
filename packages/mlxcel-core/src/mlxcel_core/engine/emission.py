"""Emitting a sequence's tokens to its sink: text, stop criteria, and its final output."""

from __future__ import annotations

import time

import mlx.core as mx

from mlxcel_core.engine.request import EngineOutput
from mlxcel_core.engine.scheduler import Scheduler
from mlxcel_core.engine.sequence import FINISHED_STATUS, Sequence
from mlxcel_core.logprobs import TokenLogprobs
from mlxcel_core.request import GenerationStats


def emit_token(
    scheduler: Scheduler, sequence: Sequence, token_id: int, logprobs: TokenLogprobs | None
) -> None:
    """Emit a token already appended to the sequence's tokens; end it if it stops."""
    now = time.perf_counter()
    if sequence.first_token_time is None:
        sequence.first_token_time = now
    sequence.last_token_time = now
    if sequence.request.constraint is not None:
        sequence.request.constraint.advance(token_id)
    text = sequence.text.add(token_id)
    if token_id not in sequence.request.generation.stop_token_ids:
        sequence.sink.put(
            EngineOutput(
                sequence.request.index,
                text,
                token_id,
                seed=sequence.sampler.seed,
                logprobs=logprobs,
            )
        )
    reason = sequence.text.finish_reason
    if reason is not None:
        scheduler.finish(sequence, FINISHED_STATUS[reason])
        emit_final(sequence, sequence.text.finish())


def emit_final(sequence: Sequence, final_text: str) -> None:
    """Send a finished sequence's last text, its finish reason and its statistics."""
    start = sequence.first_scheduled_time or sequence.arrival_time
    first = sequence.first_token_time or start
    stats = GenerationStats(
        prompt_tokens=sequence.num_prompt_tokens,
        prompt_seconds=first - start,
        generated_tokens=sequence.text.num_generated,
        decode_seconds=(sequence.last_token_time or first) - first,
        peak_memory_bytes=mx.get_peak_memory(),
        cached_tokens=sequence.num_cached_tokens,
        draft_tokens=sequence.num_draft_tokens,
        accepted_draft_tokens=sequence.num_accepted_draft_tokens,
    )
    sequence.sink.put(
        EngineOutput(
            sequence.request.index,
            final_text,
            None,
            sequence.text.finish_reason,
            stats,
            sequence.sampler.seed,
        )
    )
