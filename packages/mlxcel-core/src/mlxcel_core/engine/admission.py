"""Turning a submitted request into a sequence the scheduler can queue."""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.cache.paged import KeyedSpan
from mlxcel_core.engine.emission import emit_final
from mlxcel_core.engine.request import EngineOutput, EngineRequest, OutputSink, RequestHandle
from mlxcel_core.engine.sequence import FINISHED_STATUS, Sequence
from mlxcel_core.sampling import Sampler
from mlxcel_core.text_assembler import TextAssembler

# A group's prompt as forking sees it: handle id, prompt ids, adapter-scales salt, images.
GroupPrompt = tuple[int, tuple[int, ...], tuple[str, ...], tuple[KeyedSpan, ...]]


@dataclass(frozen=True)
class Submission:
    """A request handed to the engine, with the ids and sink it runs under.

    Attributes:
        seq_id: the sequence id it runs as, unique within the engine.
        request: what was asked.
        sink: where its outputs go.
        handle: its group's handle (cancellation).
    """

    seq_id: int
    request: EngineRequest
    sink: OutputSink
    handle: RequestHandle


def make_sequence(
    submission: Submission, context_size: int, adapters: RowAdapterScales | None
) -> Sequence | None:
    """The submission's sequence, or None when it ends at once: its sink then has its
    error (a context larger than the engine's, bad sampler settings) or, with nothing to
    generate, its final output.

    Args:
        submission: the request and its ids.
        context_size: the engine's context size (tokens).
        adapters: the model's unfused LoRA adapters, which resolve the request's scales.
    """
    request = submission.request
    try:
        if request.generation.context_size > context_size:
            raise ValueError(
                f"the request's context size ({request.generation.context_size} tokens) "
                f"exceeds the engine's ({context_size})"
            )
        text = TextAssembler(request.detokenizer, request.generation, len(request.prompt_ids))
        sampler = Sampler(request.sampling, dry_breaker_ids=request.dry_breaker_ids)
    except ValueError as error:
        submission.sink.put(EngineOutput(request.index, error=error))
        return None
    sequence = Sequence(
        submission.seq_id, request, submission.sink, submission.handle, sampler, text
    )
    if adapters is not None:
        sequence.adapter_scales = adapters.resolve_scales(request.adapter_scales)
    if text.finish_reason is not None:
        # Nothing to generate (a zero token budget): it ends without ever being queued.
        sequence.status = FINISHED_STATUS[text.finish_reason]
        emit_final(sequence, text.finish())
        return None
    return sequence


def group_prompt(sequence: Sequence) -> GroupPrompt:
    """The key under which a group's choices of one prompt share its KV."""
    return (
        sequence.handle.request_id,
        sequence.request.prompt_ids,
        sequence.cache_salt,
        sequence.cache_spans,
    )
