"""`POST /v1/chat/completions` (and `/chat/completions`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from quart import Blueprint, Response, jsonify

from mlxcel_core.engine import EngineOutput
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server import generation
from mlxcel_server.errors import ApiError, invalid
from mlxcel_server.logprobs import make_chat_logprobs
from mlxcel_server.request_params import chat_num_top_logprobs
from mlxcel_server.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    make_timings,
    make_usage,
)
from mlxcel_server.schemas import ChatCompletionRequest, ChatMessage
from mlxcel_server.settings import ServerSettings
from mlxcel_server.sse import DONE, encode_event, sse_response
from mlxcel_server.state import ServerState, ServingModel
from mlxcel_server.validation import parse_body


async def encode_messages(model: ServingModel, messages: list[ChatMessage]) -> list[int]:
    """Token ids of the conversation through the model's chat template (off the event loop).

    Raises:
        ApiError: 400 for no messages, or when the template rejects the conversation.
    """
    if not messages:
        raise invalid("messages must hold at least one message", "messages")
    conversation = [{"role": m.role, "content": m.text()} for m in messages]
    try:
        return await asyncio.to_thread(model.loaded.tokenizer.encode_chat, conversation)
    except ValueError as error:
        raise invalid(str(error), "messages") from error


def _chunk(prepared: generation.Prepared, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=prepared.response_id,
        created=prepared.created,
        model=prepared.model_id,
        choices=choices,
    )


async def _events(
    prepared: generation.Prepared,
    outputs: AsyncIterator[EngineOutput],
    include_usage: bool,
    tokenizer: Tokenizer,
) -> AsyncIterator[bytes]:
    started: set[int] = set()
    stats = []
    completion_tokens = 0
    try:
        async for output in outputs:
            first = output.index not in started
            started.add(output.index)
            if not (first or output.text or output.finished or output.logprobs):
                continue
            delta = ChatDelta(role="assistant" if first else None, content=output.text)
            choice = ChatChunkChoice(index=output.index, delta=delta)
            if output.logprobs is not None:
                choice.logprobs = make_chat_logprobs([output.logprobs], tokenizer)
            chunk = _chunk(prepared, [choice])
            if output.finish_reason is not None and output.stats is not None:
                chunk.choices[0].finish_reason = output.finish_reason
                stats.append(output.stats)
                completion_tokens += output.stats.generated_tokens
                if len(stats) == len(prepared.requests):
                    chunk.timings = make_timings(stats)
            yield encode_event(chunk)
    except ApiError as error:
        yield encode_event(error.body())
        return
    if include_usage:
        final = _chunk(prepared, [])
        final.usage = make_usage(prepared.prompt_tokens, completion_tokens)
        final.timings = make_timings(stats)
        yield encode_event(final)
    yield DONE


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    blueprint = Blueprint("chat", __name__)

    @blueprint.post("/v1/chat/completions")
    @blueprint.post("/chat/completions")
    async def chat_completions() -> Response:
        body = await parse_body(ChatCompletionRequest)
        model = state.require_model()
        generation.check_model_name(model, body.model)
        ids = await encode_messages(model, body.messages)
        generation.check_prompt(ids, model.context_size, "messages")
        num_top = chat_num_top_logprobs(body)
        prepared = generation.prepare(
            [ids], body, model, settings, id_prefix="chatcmpl", num_top_logprobs=num_top
        )
        tokenizer = model.loaded.tokenizer
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            outputs = await generation.stream(model, prepared)
            return sse_response(_events(prepared, outputs, include_usage, tokenizer))
        results = await generation.collect(model, prepared)
        completion = ChatCompletion(
            id=prepared.response_id,
            created=prepared.created,
            model=prepared.model_id,
            choices=[
                ChatChoice(
                    index=r.index,
                    message=AssistantMessage(content=r.text),
                    finish_reason=r.finish_reason,
                    logprobs=None if num_top is None else make_chat_logprobs(r.logprobs, tokenizer),
                )
                for r in results
            ],
            usage=make_usage(
                prepared.prompt_tokens, sum(r.stats.generated_tokens for r in results)
            ),
            timings=make_timings([r.stats for r in results]),
        )
        return jsonify(completion.model_dump(mode="json"))

    return blueprint
