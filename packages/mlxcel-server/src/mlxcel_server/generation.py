"""The shared path of the generation endpoints: prompts → engine requests → outputs.

Handlers validate, call `prepare` to build the engine requests, then either `collect` the
finished choices or iterate `stream` for SSE; both cancel the engine requests when the
client goes away (a `CancelledError` at an `await`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from mlxcel_core.engine import (
    EngineClosedError,
    EngineOutput,
    EngineOverloadedError,
    EngineRequest,
    EngineUnavailableError,
    ImagesNotSupportedError,
    RequestHandle,
)
from mlxcel_core.images import PromptImage
from mlxcel_core.logprobs import TokenLogprobs
from mlxcel_core.request import ContextOverflowError, GenerationStats
from mlxcel_core.sampling import TokenConstraint
from mlxcel_server.errors import ApiError, invalid
from mlxcel_server.reasoning import ReasoningPlan, ReplyReader
from mlxcel_server.request_params import (
    adapter_scales,
    check_n,
    choice_sampling,
    generation_config,
    sampling_params,
)
from mlxcel_server.schemas import GenerationFields
from mlxcel_server.settings import ServerSettings
from mlxcel_server.sink import AsyncOutputQueue
from mlxcel_server.state import ServingModel
from mlxcel_server.structured import Grammar, GrammarConstraint, compile_grammar

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """A validated generation request, ready to submit.

    Attributes:
        requests: one engine request per choice; choice `i * n + j` is prompt i's j-th.
        num_choices: choices per prompt (`n`).
        prompt_tokens: prompt tokens summed over the prompts (each counted once).
        response_id: the id the reply carries.
        created: Unix time (seconds) of the request.
        model_id: the model name the reply carries.
        reasoning: how the replies are read for reasoning; None for plain text.
    """

    requests: tuple[EngineRequest, ...]
    num_choices: int
    prompt_tokens: int
    response_id: str
    created: int
    model_id: str
    reasoning: ReasoningPlan | None = None


@dataclass(frozen=True)
class ChoiceResult:
    """One finished choice.

    Attributes:
        index: the choice's index.
        text: its whole text; its answer only when the reply was read for reasoning.
        finish_reason: OpenAI's `finish_reason`.
        stats: its timings.
        logprobs: one entry per generated token shown, when the request asked for them.
        reasoning: its reasoning text, markers removed.
        reasoning_tokens: tokens generated inside its reasoning span.
    """

    index: int
    text: str
    finish_reason: str
    stats: GenerationStats
    logprobs: tuple[TokenLogprobs, ...] = ()
    reasoning: str = ""
    reasoning_tokens: int = 0


def check_token_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    """Raises: ApiError: 400 naming up to 8 ids outside the vocabulary [0, `vocab_size`)."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise invalid(
            f"{param}: token ids {bad[:8]} are outside the vocabulary [0, {vocab_size})", param
        )


def check_prompt(ids: Sequence[int], context_size: int, param: str) -> None:
    """Raises: ApiError: 400 for an empty prompt or one that does not fit the context."""
    if not ids:
        raise invalid(f"{param}: the prompt is empty (it encodes to no tokens)", param)
    if len(ids) >= context_size:
        raise invalid(
            f"the prompt has {len(ids)} tokens but the context size is {context_size} tokens; "
            "shorten the prompt",
            param,
            code="context_length_exceeded",
        )


def prepare(
    prompts: Sequence[Sequence[int]],
    fields: GenerationFields,
    model: ServingModel,
    settings: ServerSettings,
    *,
    id_prefix: str,
    num_top_logprobs: int | None = None,
    grammar: Grammar | None = None,
    reasoning: ReasoningPlan | None = None,
    prompt_images: Sequence[tuple[PromptImage, ...]] | None = None,
    keep_special_tokens: bool = False,
) -> Prepared:
    """Build one engine request per choice of each prompt.

    With a grammar (structured output, tool calls), each choice gets its own grammar
    constraint; with a reasoning plan, the grammar applies to the answer only and a
    reasoning budget is enforced per choice.

    Args:
        num_top_logprobs: None for no log probabilities, else the alternatives per token.
        grammar: the grammar replies follow, or None for free text.
        reasoning: how the replies are read for reasoning, or None.
        prompt_images: each prompt's images (placeholder runs in its ids), or None when
            no prompt holds any.
        keep_special_tokens: keep special tokens in the text (a tool convention's marker
            that is one); reasoning markers that are special tokens are kept anyway.

    Raises:
        ApiError: 400 naming the field at fault.
    """
    check_n(fields, settings)
    tokenizer = model.loaded.tokenizer
    params = sampling_params(fields, settings.sampling, tokenizer)
    config = generation_config(
        fields, settings, model.context_size, tokenizer, num_top_logprobs=num_top_logprobs
    )
    breakers = (
        tokenizer.token_ids_containing(params.dry_sequence_breakers)
        if params.dry_multiplier > 0
        else frozenset()
    )
    matcher = None if grammar is None else compile_grammar(grammar, tokenizer)
    scales = adapter_scales(fields, model.loaded.adapters)
    # Special-token markers (gpt-oss's) must reach the text to be split out of it.
    keep_markers = keep_special_tokens or (
        reasoning is not None and reasoning.splits and reasoning.syntax.markers_are_special
    )

    def constraint() -> TokenConstraint | None:
        grammar = None if matcher is None else GrammarConstraint(matcher.deep_copy())
        return grammar if reasoning is None else reasoning.make_constraint(grammar)

    requests = tuple(
        EngineRequest(
            prompt_ids=tuple(ids),
            sampling=choice_sampling(params, choice),
            generation=config,
            detokenizer=tokenizer.make_detokenizer(skip_special_tokens=not keep_markers),
            dry_breaker_ids=breakers,
            index=prompt_index * fields.n + choice,
            constraint=constraint(),
            adapter_scales=scales,
            images=() if prompt_images is None else prompt_images[prompt_index],
            use_prefix_cache=fields.cache_prompt,
        )
        for prompt_index, ids in enumerate(prompts)
        for choice in range(fields.n)
    )
    return Prepared(
        requests=requests,
        num_choices=fields.n,
        prompt_tokens=sum(len(ids) for ids in prompts),
        response_id=f"{id_prefix}-{uuid.uuid4().hex}",
        created=int(time.time()),
        model_id=model.model_id,
        reasoning=reasoning,
    )


def _submit(model: ServingModel, prepared: Prepared) -> tuple[RequestHandle, AsyncOutputQueue]:
    sink = AsyncOutputQueue(asyncio.get_running_loop())
    try:
        handle = model.engine.submit(prepared.requests, sink)
    except ImagesNotSupportedError as error:
        raise invalid(str(error)) from error
    except ValueError as error:
        # Only a group larger than the queue bound gets here (the requests are validated).
        raise invalid(f"n: {error}; ask for fewer choices", "n") from error
    except EngineOverloadedError as error:
        raise ApiError(
            503, str(error), headers={"Retry-After": str(error.retry_after_seconds)}
        ) from error
    except EngineClosedError as error:
        raise ApiError(503, "the server is shutting down") from error
    return handle, sink


def _api_error(error: Exception) -> ApiError:
    if isinstance(error, EngineClosedError):
        return ApiError(503, "the server is shutting down")
    if isinstance(error, EngineUnavailableError):
        return ApiError(503, str(error))
    if isinstance(error, ContextOverflowError):
        return invalid(str(error), code="context_length_exceeded")
    logger.error("generation failed", exc_info=error)
    return ApiError(500, "generation failed; the server log has the details")


async def stream(model: ServingModel, prepared: Prepared) -> AsyncIterator[EngineOutput]:
    """Submit now and return the outputs of every choice as they come.

    Submission happens before the first output is awaited, so an overload is a 503 the
    handler can answer before any stream data.

    Raises:
        ApiError: 503 on overload (at once); later, from the iterator, when a choice fails.
    """
    handle, sink = _submit(model, prepared)

    async def outputs() -> AsyncIterator[EngineOutput]:
        remaining = len(prepared.requests)
        try:
            while remaining:
                output = await sink.get()
                if output.error is not None:
                    raise _api_error(output.error)
                if output.stats is not None:
                    model.totals.record(output.stats)
                remaining -= output.finished
                yield output
        finally:
            handle.cancel()

    return outputs()


async def collect(model: ServingModel, prepared: Prepared) -> list[ChoiceResult]:
    """Submit and wait for every choice to finish; results sorted by index.

    Raises:
        ApiError: 503 on overload or shutdown; 500 when generation fails.
    """
    readers: dict[int, ReplyReader] = {}
    texts: dict[int, list[str]] = {}
    thoughts: dict[int, list[str]] = {}
    logprobs: dict[int, list[TokenLogprobs]] = {}
    results: list[ChoiceResult] = []
    async for output in await stream(model, prepared):
        reader = readers.setdefault(output.index, ReplyReader(prepared.reasoning))
        delta = reader.read(output)
        texts.setdefault(output.index, []).append(delta.content)
        thoughts.setdefault(output.index, []).append(delta.reasoning)
        if output.logprobs is not None:
            logprobs.setdefault(output.index, []).append(output.logprobs)
        if output.finish_reason is not None and output.stats is not None:
            results.append(
                ChoiceResult(
                    output.index,
                    "".join(texts[output.index]),
                    output.finish_reason,
                    output.stats,
                    tuple(logprobs.get(output.index, ())),
                    "".join(thoughts[output.index]),
                    reader.num_reasoning_tokens,
                )
            )
    return sorted(results, key=lambda result: result.index)
