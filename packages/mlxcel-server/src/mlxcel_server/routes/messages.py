"""`POST /v1/messages` and `POST /v1/messages/count_tokens` (and their unversioned paths):
Anthropic's Messages API, run as the chat completion it translates to; a reasoning model's
reasoning comes back as a thinking block."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from quart import Blueprint, Response, jsonify

from mlxcel_core.engine import EngineOutput
from mlxcel_core.request import FinishReason, GenerationStats
from mlxcel_server import generation
from mlxcel_server.anthropic_api.conversation import chat_request, generation_request
from mlxcel_server.anthropic_api.events import StreamTarget, message_events
from mlxcel_server.anthropic_api.objects import (
    MessageObject,
    ToolUseContent,
    make_content,
    make_message_id,
    make_usage,
)
from mlxcel_server.anthropic_api.request import (
    CountTokensRequest,
    MessagesRequest,
    ThinkingConfig,
)
from mlxcel_server.anthropic_api.stop_reason import EndingTracker
from mlxcel_server.anthropic_api.thinking import (
    check_thinking_budget,
    reasoning_budget,
    reasoning_format,
)
from mlxcel_server.prompting import ChatPrompt, build_chat_prompt
from mlxcel_server.reasoning import ReplyReader
from mlxcel_server.schemas import ChatCompletionRequest
from mlxcel_server.settings import ServerSettings
from mlxcel_server.sse import sse_response
from mlxcel_server.state import ServerState, ServingModel
from mlxcel_server.tools.pairing import ANTHROPIC_TERMS
from mlxcel_server.validation import parse_body


async def _chat_prompt(
    model: ServingModel,
    chat: ChatCompletionRequest,
    thinking: ThinkingConfig | None,
    settings: ServerSettings,
    *,
    check: bool = True,
) -> ChatPrompt:
    """The prompt through the chat path's prompt builder, its tool use, and how its reply
    is read for reasoning.

    Raises:
        ApiError: 400 as `build_chat_prompt`.
    """
    return await build_chat_prompt(
        model,
        chat,
        image_decoder=settings.image_decoder,
        reasoning_format=reasoning_format(thinking, settings),
        reasoning_budget=reasoning_budget(thinking, settings),
        param="messages",
        tool_terms=ANTHROPIC_TERMS,
        check=check,
    )


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    blueprint = Blueprint("messages", __name__)

    @blueprint.post("/v1/messages")
    @blueprint.post("/messages")
    async def create_message() -> Response:
        body = await parse_body(MessagesRequest)
        check_thinking_budget(body)
        model = state.require_model()
        chat = generation_request(body)
        prompt = await _chat_prompt(model, chat, body.thinking, settings)
        ids, tool_use, plan = prompt.ids, prompt.tool_use, prompt.reasoning
        prepared = generation.prepare(
            [ids],
            chat,
            model,
            settings,
            id_prefix="msg",
            grammar=prompt.grammar,
            reasoning=plan,
            prompt_images=[prompt.images],
            keep_special_tokens=prompt.keep_special_tokens,
        )
        message_id = make_message_id()
        tracker = EndingTracker(model.loaded.tokenizer, body.stop_sequences or ())
        outputs = await generation.stream(model, prepared)
        if body.stream:
            target = StreamTarget(message_id, model.model_id, len(ids), tool_use, tracker, plan)
            return sse_response(message_events(target, outputs))
        text, reasoning, finish_reason, stats = await _collect(outputs, tracker, ReplyReader(plan))
        content = make_content(text, tool_use, reasoning)
        calls_tools = any(isinstance(block, ToolUseContent) for block in content)
        ending = tracker.ending(finish_reason, calls_tools=calls_tools)
        message = MessageObject(
            id=message_id,
            model=model.model_id,
            content=content,
            stop_reason=ending.stop_reason,
            stop_sequence=ending.stop_sequence,
            usage=make_usage(len(ids), stats),
        )
        return jsonify(message.model_dump(mode="json"))

    @blueprint.post("/v1/messages/count_tokens")
    @blueprint.post("/messages/count_tokens")
    async def count_tokens() -> Response:
        body = await parse_body(CountTokensRequest)
        model = state.require_model()
        chat = chat_request(body)
        prompt = await _chat_prompt(model, chat, body.thinking, settings, check=False)
        return jsonify({"input_tokens": len(prompt.ids)})

    return blueprint


async def _collect(
    outputs: AsyncIterator[EngineOutput], tracker: EndingTracker, reader: ReplyReader
) -> tuple[str, str, FinishReason, GenerationStats]:
    """A whole reply's answer text, reasoning text, finish reason and statistics."""
    texts: list[str] = []
    thoughts: list[str] = []
    finish_reason, stats = FinishReason.STOP, None
    async with contextlib.aclosing(outputs):
        async for output in outputs:
            tracker.add(output)
            piece = reader.read(output)
            texts.append(piece.content)
            thoughts.append(piece.reasoning)
            if output.finish_reason is not None and output.stats is not None:
                finish_reason, stats = output.finish_reason, output.stats
    # The engine ends every reply with a finish reason and statistics, or an error.
    assert stats is not None
    return "".join(texts), "".join(thoughts), finish_reason, stats
