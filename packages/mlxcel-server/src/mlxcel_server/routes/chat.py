"""`POST /v1/chat/completions` (and `/chat/completions`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from quart import Blueprint, Response, jsonify

from mlxcel_core.engine import EngineOutput
from mlxcel_core.request import FinishReason, GenerationStats
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server import generation
from mlxcel_server.errors import ApiError
from mlxcel_server.logprobs import make_chat_logprobs
from mlxcel_server.prompting import build_chat_prompt
from mlxcel_server.reasoning import ReasoningFormat, ReplyReader
from mlxcel_server.request_params import chat_num_top_logprobs
from mlxcel_server.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    FunctionCallDelta,
    FunctionCallOut,
    ToolCallDelta,
    ToolCallOut,
    make_timings,
    make_usage,
)
from mlxcel_server.schemas import ChatCompletionRequest
from mlxcel_server.settings import ServerSettings
from mlxcel_server.sse import DONE, encode_event, sse_response
from mlxcel_server.state import ServerState
from mlxcel_server.tools.reader import CallDelta, ToolCallReader, read_reply
from mlxcel_server.tools.use import ToolUse, make_call_id
from mlxcel_server.validation import parse_body


def finish_reason_of(engine_reason: str, calls_tools: bool) -> str:
    """A reply's `finish_reason`: "length" when the token limit cut it (its last call's
    arguments may then be partial), else "tool_calls" when it calls, else the engine's."""
    if engine_reason == FinishReason.LENGTH:
        return engine_reason
    return "tool_calls" if calls_tools else engine_reason


def make_message(
    text: str, finish_reason: str, tool_use: ToolUse | None, reasoning: str | None = None
) -> tuple[AssistantMessage, str]:
    """A finished reply as a message and its finish reason.

    Tool calls are read from `text`, the answer, never from the `reasoning`.
    """
    if tool_use is None:
        return AssistantMessage(content=text, reasoning_content=reasoning), finish_reason
    reply = read_reply(text, tool_use.tool_format, parallel=tool_use.parallel)
    tool_calls = [
        ToolCallOut(id=make_call_id(), function=FunctionCallOut(name=c.name, arguments=c.arguments))
        for c in reply.tool_calls
    ]
    message = AssistantMessage(
        content=reply.content, reasoning_content=reasoning, tool_calls=tool_calls or None
    )
    return message, finish_reason_of(finish_reason, bool(tool_calls))


def _chunk(prepared: generation.Prepared, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=prepared.response_id,
        created=prepared.created,
        model=prepared.model_id,
        choices=choices,
    )


def _tool_call_delta(delta: CallDelta) -> ToolCallDelta:
    if delta.name is None:
        return ToolCallDelta(
            index=delta.index, function=FunctionCallDelta(arguments=delta.arguments)
        )
    return ToolCallDelta(
        index=delta.index,
        id=make_call_id(),
        type="function",
        function=FunctionCallDelta(name=delta.name, arguments=delta.arguments),
    )


async def _events(
    prepared: generation.Prepared,
    outputs: AsyncIterator[EngineOutput],
    include_usage: bool,
    tokenizer: Tokenizer,
    tool_use: ToolUse | None,
) -> AsyncIterator[bytes]:
    started: set[int] = set()
    readers: dict[int, ReplyReader] = {}
    tool_readers: dict[int, ToolCallReader] = {}
    stats: dict[int, GenerationStats] = {}
    try:
        async for output in outputs:
            first = output.index not in started
            started.add(output.index)
            reader = readers.setdefault(output.index, ReplyReader(prepared.reasoning))
            piece = reader.read(output)
            content = piece.content
            calls: Sequence[CallDelta] = ()
            if tool_use is not None:
                calls_reader = tool_readers.setdefault(
                    output.index, ToolCallReader(tool_use.tool_format, parallel=tool_use.parallel)
                )
                read = calls_reader.feed(content)
                if output.finished:
                    read = read + calls_reader.finish()
                content, calls = read.content, read.calls
            news = content or piece.reasoning or calls or output.logprobs
            if not (first or news or output.finished):
                continue
            delta = ChatDelta(
                role="assistant" if first else None,
                # A piece of reasoning alone carries no content, as llama-server sends it.
                content=None if (piece.reasoning or calls) and not content else content,
                reasoning_content=piece.reasoning or None,
                tool_calls=[_tool_call_delta(call) for call in calls] or None,
            )
            choice = ChatChunkChoice(index=output.index, delta=delta)
            if output.logprobs is not None:
                choice.logprobs = make_chat_logprobs([output.logprobs], tokenizer)
            chunk = _chunk(prepared, [choice])
            if output.finish_reason is not None and output.stats is not None:
                num_calls = 0 if tool_use is None else tool_readers[output.index].num_calls
                choice.finish_reason = finish_reason_of(output.finish_reason, num_calls > 0)
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
            prepared.prompt_tokens,
            [stats[i] for i in sorted(stats)],
            prepared.num_choices,
            reasoning_tokens=sum(reader.num_reasoning_tokens for reader in readers.values()),
        )
        final.timings = make_timings(list(stats.values()))
        yield encode_event(final)
    yield DONE


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    blueprint = Blueprint("chat", __name__)

    @blueprint.post("/v1/chat/completions")
    @blueprint.post("/chat/completions")
    async def chat_completions() -> Response:
        body = await parse_body(ChatCompletionRequest)
        model = state.require_model()
        prompt = await build_chat_prompt(
            model,
            body,
            image_decoder=settings.image_decoder,
            reasoning_format=ReasoningFormat(body.reasoning_format or settings.reasoning_format),
            reasoning_budget=settings.reasoning_budget,
        )
        tokenizer = model.loaded.tokenizer
        tool_use = prompt.tool_use
        num_top = chat_num_top_logprobs(body)
        prepared = generation.prepare(
            [prompt.ids],
            body,
            model,
            settings,
            id_prefix="chatcmpl",
            num_top_logprobs=num_top,
            grammar=prompt.grammar,
            reasoning=prompt.reasoning,
            prompt_images=[prompt.images],
            keep_special_tokens=prompt.keep_special_tokens,
        )
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            outputs = await generation.stream(model, prepared)
            return sse_response(_events(prepared, outputs, include_usage, tokenizer, tool_use))
        results = await generation.collect(model, prepared)
        messages = [
            make_message(r.text, r.finish_reason, tool_use, r.reasoning or None) for r in results
        ]
        completion = ChatCompletion(
            id=prepared.response_id,
            created=prepared.created,
            model=prepared.model_id,
            choices=[
                ChatChoice(
                    index=r.index,
                    message=message,
                    finish_reason=finish_reason,
                    logprobs=None if num_top is None else make_chat_logprobs(r.logprobs, tokenizer),
                )
                for r, (message, finish_reason) in zip(results, messages, strict=True)
            ],
            usage=make_usage(
                prepared.prompt_tokens,
                [r.stats for r in results],
                prepared.num_choices,
                reasoning_tokens=sum(r.reasoning_tokens for r in results),
            ),
            timings=make_timings([r.stats for r in results]),
        )
        return jsonify(completion.model_dump(mode="json"))

    return blueprint
