"""`POST /v1/messages` and `POST /v1/messages/count_tokens` (and their unversioned paths):
Anthropic's Messages API, run as the chat completion it translates to; a reasoning model's
reasoning comes back as a thinking block."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from quart import Blueprint, Response, jsonify

from mlxcel_core.engine import EngineOutput
from mlxcel_core.generate import FinishReason, GenerationStats
from mlxcel_models.image_prompt import ImagePrompt
from mlxcel_models.tokenizer.reasoning import find_reasoning_syntax
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
from mlxcel_server.reasoning import ReasoningPlan, ReplyReader, make_plan, template_kwargs
from mlxcel_server.routes.chat import ToolUse, encode_messages, make_tool_use
from mlxcel_server.schemas import ChatCompletionRequest
from mlxcel_server.settings import ServerSettings
from mlxcel_server.sse import sse_response
from mlxcel_server.state import ServerState, ServingModel
from mlxcel_server.validation import parse_body


async def _encode_prompt(
    model: ServingModel,
    chat: ChatCompletionRequest,
    thinking: ThinkingConfig | None,
    settings: ServerSettings,
) -> tuple[ImagePrompt, ToolUse | None, ReasoningPlan | None]:
    """The prompt (token ids and image runs) through the chat path's template rendering,
    its tool use, and how its reply is read for reasoning.

    Raises:
        ApiError: 404 for another model's name; 400 for tools or tool blocks the model's
            chat template cannot render, or a conversation it rejects.
    """
    generation.check_model_name(model, chat.model)
    tokenizer = model.loaded.tokenizer
    tool_use = make_tool_use(chat, tokenizer.chat_template)
    tools = None
    if tool_use is not None and chat.tools is not None:
        tools = [tool.template_dict() for tool in chat.tools]
    syntax = find_reasoning_syntax(tokenizer)
    budget = reasoning_budget(thinking, settings)
    kwargs = template_kwargs(None, syntax, budget)
    prompt = await encode_messages(
        model,
        chat.messages,
        image_decoder=settings.image_decoder,
        tools=tools,
        template_kwargs=kwargs,
        param="messages",
    )
    plan = make_plan(
        syntax, reasoning_format(thinking, settings), budget, tokenizer, list(prompt.prompt_ids)
    )
    return prompt, tool_use, plan


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    blueprint = Blueprint("messages", __name__)

    @blueprint.post("/v1/messages")
    @blueprint.post("/messages")
    async def create_message() -> Response:
        body = await parse_body(MessagesRequest)
        check_thinking_budget(body)
        model = state.require_model()
        chat = generation_request(body)
        prompt, tool_use, plan = await _encode_prompt(model, chat, body.thinking, settings)
        ids = list(prompt.prompt_ids)
        generation.check_prompt(ids, model.context_size, "messages")
        prepared = generation.prepare(
            [ids],
            chat,
            model,
            settings,
            id_prefix="msg",
            reasoning=plan,
            prompt_images=[prompt.images],
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
        prompt, _, _ = await _encode_prompt(model, chat_request(body), body.thinking, settings)
        return jsonify({"input_tokens": len(prompt.prompt_ids)})

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
