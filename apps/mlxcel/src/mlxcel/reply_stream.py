"""One reply from the continuous-batching engine, its text handed on piece by piece.

`generate` writes the pieces to stdout; `run` also keeps them for the conversation. A
Ctrl-C while a reply streams cancels its engine request before the interrupt goes on.
"""

from __future__ import annotations

from collections.abc import Callable

from mlxcel.engine_outputs import next_output
from mlxcel.flags import RunError
from mlxcel.reply_reasoning import ReplyReasoning
from mlxcel_core.engine import Engine, EngineOutput, EngineRequest, OutputQueue
from mlxcel_core.generate import GenerationConfig
from mlxcel_core.images import PromptImage
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


def stream_reply(
    engine: Engine, request: EngineRequest, on_text: Callable[[str], None]
) -> EngineOutput:
    """Generate `request` on `engine`, passing each new piece of text to `on_text`.

    Returns:
        The terminal output, with its `finish_reason` and `stats`.

    Raises:
        RunError: generation failed.
        KeyboardInterrupt: passed on once the engine has ended the cancelled request.
    """
    sink = OutputQueue()
    handle = engine.submit([request], sink)
    try:
        while True:
            output = next_output(sink)
            if output.error is not None:
                raise RunError(f"generation failed: {output.error}")
            on_text(output.text)
            if output.finished:
                return output
    except KeyboardInterrupt:
        handle.cancel()
        while not next_output(sink).finished:
            pass
        raise
