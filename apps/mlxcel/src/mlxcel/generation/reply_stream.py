"""One reply from the continuous-batching engine, its text handed on piece by piece.

`generate` writes the pieces to stdout; `run` also keeps them for the conversation. A
Ctrl-C while a reply streams cancels its engine request before the interrupt goes on, as
a `ReplyInterrupted` that measures what was generated up to it (a cancelled request gets
no stats from the engine).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import mlx.core as mx

from mlxcel.common.flags import RunError
from mlxcel.generation.engine_outputs import next_output
from mlxcel.generation.reply_reasoning import ReplyReasoning
from mlxcel_core.engine import Engine, EngineOutput, EngineRequest, OutputQueue
from mlxcel_core.images import PromptImage
from mlxcel_core.request import GenerationConfig, GenerationStats
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.tokenizer import Tokenizer


def make_reply_request(
    tokenizer: Tokenizer,
    tokens: list[int],
    params: SamplingParams,
    *,
    context_size: int,
    max_tokens: int,
    reasoning: ReplyReasoning,
    images: tuple[PromptImage, ...] = (),
) -> EngineRequest:
    """An engine request for the reply to prompt `tokens` (whose image runs are
    `images`), stopping at the model's end tokens, after `max_tokens` tokens (-1: none)
    or at `context_size` tokens in all; its reasoning bounded by `reasoning.budget`, its
    text keeping the reasoning markers."""
    return EngineRequest(
        prompt_ids=tuple(tokens),
        sampling=params,
        generation=GenerationConfig(
            context_size=context_size,
            max_tokens=max_tokens,
            stop_token_ids=tokenizer.eos_token_ids,
        ),
        detokenizer=reasoning.make_detokenizer(tokenizer),
        dry_breaker_ids=tokenizer.token_ids_containing(params.dry_sequence_breakers),
        constraint=reasoning.make_constraint(),
        images=images,
    )


class ReplyInterrupted(KeyboardInterrupt):
    """A Ctrl-C while a reply streamed, raised once its request has ended.

    Attributes:
        stats: the prompt and the tokens generated up to the interrupt, timed here.
    """

    def __init__(self, stats: GenerationStats) -> None:
        super().__init__()
        self.stats = stats


class _Timing:
    """When a reply's request was submitted and its first and last tokens came."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0

    def record(self, output: EngineOutput) -> None:
        if output.token_id is None:
            return
        self.last = time.perf_counter()
        self.first = self.first or self.last
        self.tokens += 1

    def stats(self, prompt_tokens: int) -> GenerationStats:
        first = self.first or time.perf_counter()
        return GenerationStats(
            prompt_tokens=prompt_tokens,
            prompt_seconds=first - self.start,
            generated_tokens=self.tokens,
            decode_seconds=(self.last or first) - first,
            peak_memory_bytes=mx.get_peak_memory(),
        )


def stream_reply(
    engine: Engine, request: EngineRequest, on_text: Callable[[str], None]
) -> EngineOutput:
    """Generate `request` on `engine`, passing each new piece of text to `on_text`.

    Returns:
        The terminal output, with its `finish_reason` and `stats`.

    Raises:
        RunError: generation failed.
        ReplyInterrupted: a KeyboardInterrupt, passed on once the engine has ended the
            cancelled request, with the stats of what was generated.
    """
    sink = OutputQueue()
    timing = _Timing()
    handle = engine.submit([request], sink)
    try:
        while True:
            output = next_output(sink)
            if output.error is not None:
                raise RunError(f"generation failed: {output.error}")
            timing.record(output)
            on_text(output.text)
            if output.finished:
                return output
    except KeyboardInterrupt as interrupt:
        handle.cancel()
        while not (output := next_output(sink)).finished:
            timing.record(output)
        raise ReplyInterrupted(timing.stats(len(request.prompt_ids))) from interrupt
