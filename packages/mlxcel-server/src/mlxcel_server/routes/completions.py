"""`POST /v1/completions` (and `/completions`): raw prompts, no chat template."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from quart import Blueprint, Response, jsonify

from mlxcel_core.engine import EngineOutput
from mlxcel_core.request import GenerationStats
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server import generation
from mlxcel_server.errors import ApiError, invalid
from mlxcel_server.logprobs import make_completion_logprobs
from mlxcel_server.request_params import completion_num_logprobs
from mlxcel_server.responses import Completion, CompletionChoice, make_timings, make_usage
from mlxcel_server.schemas import CompletionRequest
from mlxcel_server.settings import ServerSettings
from mlxcel_server.sse import DONE, encode_event, sse_response
from mlxcel_server.state import ServerState, ServingModel
from mlxcel_server.structured import request_grammar
from mlxcel_server.validation import parse_body


def _prompts(body: CompletionRequest) -> tuple[list[str] | list[list[int]], bool]:
    """The request's prompts (texts, or token-id lists), and whether it gave one prompt
    rather than a list of them."""
    prompt = body.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt], True
    if not prompt:
        raise invalid(
            "prompt must be a string, a list of token ids, or a non-empty list of either",
            "prompt",
        )
    return prompt, False


def _check_group_size(num_prompts: int, n: int, model: ServingModel) -> None:
    """Raises: ApiError: 400 for more prompts, times `n`, than the waiting queue holds,
    before any prompt is tokenized."""
    limit = model.engine.config.max_waiting
    if num_prompts > 1 and num_prompts * n > limit:
        raise invalid(
            f"prompt: {num_prompts} prompts with n={n} make {num_prompts * n} sequences; "
            f"a request may hold at most {limit} (the server's --max-queue)",
            "prompt",
        )


async def _prompt_ids(
    prompts: list[str] | list[list[int]], single: bool, model: ServingModel
) -> tuple[list[list[int]], list[str]]:
    """Each prompt's token ids, checked against the vocabulary and the context, and its
    text (what `echo` repeats).

    Raises:
        ApiError: 400 for a token id outside the vocabulary, or an empty prompt or one
            that does not fit the context, naming `prompt` or `prompt[i]`.
    """
    tokenizer = model.loaded.tokenizer
    ids, texts = [], []
    for i, prompt in enumerate(prompts):
        param = "prompt" if single else f"prompt[{i}]"
        if isinstance(prompt, str):
            prompt_ids = await asyncio.to_thread(tokenizer.encode, prompt)
            text = prompt
        else:
            generation.check_token_ids(prompt, tokenizer.vocab_size, param)
            prompt_ids = list(prompt)
            text = await asyncio.to_thread(tokenizer.decode, prompt, skip_special_tokens=False)
        generation.check_prompt(prompt_ids, model.context_size, param)
        ids.append(prompt_ids)
        texts.append(text)
    return ids, texts


def _chunk(prepared: generation.Prepared, choices: list[CompletionChoice]) -> Completion:
    return Completion(
        id=prepared.response_id,
        created=prepared.created,
        model=prepared.model_id,
        choices=choices,
    )


async def _events(
    prepared: generation.Prepared,
    outputs: AsyncIterator[EngineOutput],
    echoes: list[str],
    n: int,
    include_usage: bool,
    tokenizer: Tokenizer,
) -> AsyncIterator[bytes]:
    started: set[int] = set()
    # Character offset in each choice's text where its next token's text begins.
    offsets: dict[int, int] = {}
    stats: dict[int, GenerationStats] = {}
    try:
        async for output in outputs:
            first = output.index not in started
            started.add(output.index)
            text = (echoes[output.index // n] if first else "") + output.text
            if not (text or output.finished or output.logprobs):
                continue
            choice = CompletionChoice(index=output.index, text=text)
            if output.logprobs is not None:
                offset = offsets.get(output.index, len(echoes[output.index // n]))
                choice.logprobs = make_completion_logprobs([output.logprobs], tokenizer, offset)
                offsets[output.index] = offset + len(choice.logprobs.tokens[0])
            chunk = _chunk(prepared, [choice])
            if output.finish_reason is not None and output.stats is not None:
                chunk.choices[0].finish_reason = output.finish_reason
                stats[output.index] = output.stats
                if len(stats) == len(prepared.requests):
                    chunk.timings = make_timings(list(stats.values()))
            yield encode_event(chunk)
    except ApiError as error:
        yield encode_event(error.body())
        return
    if include_usage:
        final = _chunk(prepared, [])
        final.usage = make_usage(
            prepared.prompt_tokens, [stats[i] for i in sorted(stats)], prepared.num_choices
        )
        final.timings = make_timings(list(stats.values()))
        yield encode_event(final)
    yield DONE


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    blueprint = Blueprint("completions", __name__)

    @blueprint.post("/v1/completions")
    @blueprint.post("/completions")
    async def completions() -> Response:
        body = await parse_body(CompletionRequest)
        model = state.require_model()
        prompts, single = _prompts(body)
        _check_group_size(len(prompts), body.n, model)
        tokenizer = model.loaded.tokenizer
        ids, texts = await _prompt_ids(prompts, single, model)
        num_logprobs = completion_num_logprobs(body)
        prepared = generation.prepare(
            ids,
            body,
            model,
            settings,
            id_prefix="cmpl",
            num_top_logprobs=num_logprobs,
            grammar=request_grammar(body),
        )
        echoes = texts if body.echo else [""] * len(prompts)
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            outputs = await generation.stream(model, prepared)
            return sse_response(
                _events(prepared, outputs, echoes, body.n, include_usage, tokenizer)
            )
        results = await generation.collect(model, prepared)
        completion = _chunk(
            prepared,
            [
                CompletionChoice(
                    index=r.index,
                    text=echoes[r.index // body.n] + r.text,
                    finish_reason=r.finish_reason,
                    logprobs=None
                    if num_logprobs is None
                    else make_completion_logprobs(
                        r.logprobs, tokenizer, len(echoes[r.index // body.n])
                    ),
                )
                for r in results
            ],
        )
        completion.usage = make_usage(
            prepared.prompt_tokens, [r.stats for r in results], prepared.num_choices
        )
        completion.timings = make_timings([r.stats for r in results])
        return jsonify(completion.model_dump(mode="json"))

    return blueprint
