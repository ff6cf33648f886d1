"""`POST /v1/chat/completions` (and `/chat/completions`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from quart import Blueprint, Response, jsonify

from mlxcel_core.engine import EngineOutput
from mlxcel_core.generate import GenerationStats
from mlxcel_models.image_prompt import ImagePrompt
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_models.tokenizer.reasoning import find_reasoning_syntax
from mlxcel_server import generation
from mlxcel_server.errors import ApiError, invalid
from mlxcel_server.image_prompts import ImageDecoder, ImageReference, encode_image_chat
from mlxcel_server.logprobs import make_chat_logprobs
from mlxcel_server.reasoning import ReasoningFormat, ReplyReader, make_plan, template_kwargs
from mlxcel_server.request_params import chat_num_top_logprobs
from mlxcel_server.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    FunctionCallOut,
    ToolCallDelta,
    ToolCallOut,
    make_timings,
    make_usage,
)
from mlxcel_server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    ImageUrlPart,
    NamedToolChoice,
)
from mlxcel_server.settings import ServerSettings
from mlxcel_server.sse import DONE, encode_event, sse_response
from mlxcel_server.state import ServerState, ServingModel
from mlxcel_server.tool_calls import (
    ParsedToolCall,
    ToolCallFormat,
    ToolCallStream,
    detect_format,
    parse_tool_calls,
)
from mlxcel_server.validation import parse_body


@dataclass(frozen=True)
class ToolUse:
    """How a request's replies are read for tool calls.

    Attributes:
        tool_format: the model's tool-call convention.
        parallel: whether a reply may make several calls (else only the first is kept).
    """

    tool_format: ToolCallFormat
    parallel: bool

    def kept(self, calls: Sequence[ParsedToolCall]) -> Sequence[ParsedToolCall]:
        return calls if self.parallel else calls[:1]


def make_tool_use(body: ChatCompletionRequest, chat_template: str | None) -> ToolUse | None:
    """The request's tool use; None when no tools are offered or `tool_choice` is "none".

    Raises:
        ApiError: 400 naming `tool_choice` when it forces a call (that needs constrained
            decoding) or comes without tools; 400 naming `tools`, or the first message
            about tool calls, when the model's chat template teaches no tool-call convention
            mlxcel can read (the calls would be parsed wrongly or rendered without them).
    """
    if detect_format(chat_template) is None:
        for index, message in enumerate(body.messages):
            if message.tool_calls or message.role == "tool":
                raise invalid(
                    "the model's chat template has no tool-call convention, so this "
                    "conversation's tool calls and results cannot be rendered",
                    f"messages[{index}]",
                )
    if body.tool_choice == "required" or isinstance(body.tool_choice, NamedToolChoice):
        raise invalid(
            "tool_choice 'required' or a named function forces a tool call, which needs "
            "constrained decoding; mlxcel does not implement it yet (use 'auto' or 'none')",
            "tool_choice",
        )
    if not body.tools:
        if body.tool_choice not in (None, "none"):
            raise invalid("tool_choice needs tools", "tool_choice")
        return None
    if body.tool_choice == "none":
        return None
    tool_format = detect_format(chat_template)
    if tool_format is None:
        raise invalid(
            "the model's chat template teaches no tool-call convention mlxcel can read "
            "(Hermes <tool_call> or Llama-3 JSON), so its tool calls could not be parsed",
            "tools",
        )
    return ToolUse(tool_format, body.parallel_tool_calls)


def image_references(
    messages: Sequence[ChatMessage], param: str | None = None
) -> list[ImageReference]:
    """The conversation's images in order, each named by its field
    (`messages[i].content[j].image_url`), or all by `param` when given."""
    return [
        ImageReference(
            part.image_url.url, param or f"messages[{index}].content[{position}].image_url"
        )
        for index, message in enumerate(messages)
        if isinstance(message.content, list)
        for position, part in enumerate(message.content)
        if isinstance(part, ImageUrlPart)
    ]


async def encode_messages(
    model: ServingModel,
    messages: list[ChatMessage],
    *,
    image_decoder: ImageDecoder | None,
    tools: Sequence[dict] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    param: str | None = None,
) -> ImagePrompt:
    """The conversation's prompt through the model's chat template (off the event loop):
    its token ids and, when messages hold images, their placeholder runs.

    Args:
        image_decoder: reads the messages' images; None when the server reads none.
        tools: function definitions the template renders, or None for none.
        template_kwargs: extra template variables (`enable_thinking`), or None.
        param: the request field errors name, when the messages were converted from
            another API's input (else `messages`, and each image's own part).

    Raises:
        ApiError: 400 for no messages, when the template rejects the conversation, or for
            an image that cannot be used or a model without vision support (see
            `encode_image_chat`).
    """
    if not messages:
        raise invalid("messages must hold at least one message", param or "messages")
    conversation = [m.template_dict() for m in messages]
    references = image_references(messages, param)
    if references:
        return await encode_image_chat(
            model,
            conversation,
            references,
            image_decoder,
            tools=tools,
            template_kwargs=template_kwargs,
            param=param or "messages",
        )
    try:
        ids = await asyncio.to_thread(
            model.loaded.tokenizer.encode_chat,
            conversation,
            tools=tools,
            template_kwargs=template_kwargs,
        )
    except ValueError as error:
        raise invalid(str(error), param or "messages") from error
    return ImagePrompt(tuple(ids), ())


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _function(call: ParsedToolCall) -> FunctionCallOut:
    return FunctionCallOut(name=call.name, arguments=call.arguments)


def make_message(
    text: str, finish_reason: str, tool_use: ToolUse | None, reasoning: str | None = None
) -> tuple[AssistantMessage, str]:
    """A finished reply as a message and its finish reason ("tool_calls" when it calls).

    Tool calls are read from `text`, the answer, never from the `reasoning`.
    """
    if tool_use is None:
        return AssistantMessage(content=text, reasoning_content=reasoning), finish_reason
    reply = parse_tool_calls(text, tool_use.tool_format)
    calls = tool_use.kept(reply.tool_calls)
    if not calls:
        return AssistantMessage(content=text, reasoning_content=reasoning), finish_reason
    tool_calls = [ToolCallOut(id=_call_id(), function=_function(call)) for call in calls]
    message = AssistantMessage(
        content=reply.content, reasoning_content=reasoning, tool_calls=tool_calls
    )
    return message, "tool_calls"


def _chunk(prepared: generation.Prepared, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=prepared.response_id,
        created=prepared.created,
        model=prepared.model_id,
        choices=choices,
    )


def _tool_call_chunks(index: int, calls: Sequence[ParsedToolCall]) -> list[ChatChunkChoice]:
    return [
        ChatChunkChoice(
            index=index,
            delta=ChatDelta(
                tool_calls=[ToolCallDelta(index=i, id=_call_id(), function=_function(call))]
            ),
        )
        for i, call in enumerate(calls)
    ]


async def _events(
    prepared: generation.Prepared,
    outputs: AsyncIterator[EngineOutput],
    include_usage: bool,
    tokenizer: Tokenizer,
    tool_use: ToolUse | None,
) -> AsyncIterator[bytes]:
    started: set[int] = set()
    readers: dict[int, ReplyReader] = {}
    splitters: dict[int, ToolCallStream] = {}
    stats: dict[int, GenerationStats] = {}
    try:
        async for output in outputs:
            first = output.index not in started
            started.add(output.index)
            reader = readers.setdefault(output.index, ReplyReader(prepared.reasoning))
            piece = reader.read(output)
            content = piece.content
            calls: Sequence[ParsedToolCall] = ()
            if tool_use is not None:
                # Tool markup is held back until the reply ends, then sent as tool calls.
                splitter = splitters.setdefault(output.index, ToolCallStream(tool_use.tool_format))
                content = splitter.feed(content)
                if output.finished:
                    reply = splitter.finish()
                    calls = tool_use.kept(reply.tool_calls)
                    content += reply.content or ""
            if not (first or content or piece.reasoning or output.finished or output.logprobs):
                continue
            delta = ChatDelta(
                role="assistant" if first else None,
                # A piece of reasoning alone carries no content, as llama-server sends it.
                content=None if piece.reasoning and not content else content,
                reasoning_content=piece.reasoning or None,
            )
            choice = ChatChunkChoice(index=output.index, delta=delta)
            if output.logprobs is not None:
                choice.logprobs = make_chat_logprobs([output.logprobs], tokenizer)
            choices = [choice, *_tool_call_chunks(output.index, calls)]
            timings = None
            if output.finish_reason is not None and output.stats is not None:
                choices[-1].finish_reason = "tool_calls" if calls else output.finish_reason
                stats[output.index] = output.stats
                if len(stats) == len(prepared.requests):
                    timings = make_timings(list(stats.values()))
            for position, each in enumerate(choices):
                chunk = _chunk(prepared, [each])
                if position == len(choices) - 1:
                    chunk.timings = timings
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
        generation.check_model_name(model, body.model)
        tokenizer = model.loaded.tokenizer
        tool_use = make_tool_use(body, tokenizer.chat_template)
        tools = None
        if tool_use is not None and body.tools is not None:
            tools = [tool.template_dict() for tool in body.tools]
        syntax = find_reasoning_syntax(tokenizer)
        budget = settings.reasoning_budget
        kwargs = template_kwargs(body.chat_template_kwargs, syntax, budget)
        prompt = await encode_messages(
            model,
            body.messages,
            image_decoder=settings.image_decoder,
            tools=tools,
            template_kwargs=kwargs,
        )
        ids = list(prompt.prompt_ids)
        generation.check_prompt(ids, model.context_size, "messages")
        num_top = chat_num_top_logprobs(body)
        reasoning_format = ReasoningFormat(body.reasoning_format or settings.reasoning_format)
        plan = make_plan(syntax, reasoning_format, budget, tokenizer, ids)
        prepared = generation.prepare(
            [ids],
            body,
            model,
            settings,
            id_prefix="chatcmpl",
            num_top_logprobs=num_top,
            reasoning=plan,
            prompt_images=[prompt.images],
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
