"""`POST /v1/responses` and `GET /v1/responses/{id}` (and their unversioned paths)."""

from __future__ import annotations

import time
import uuid

from quart import Blueprint, Response, jsonify

from mlxcel_server import generation
from mlxcel_server.errors import ApiError, invalid
from mlxcel_server.generation import ChoiceResult
from mlxcel_server.prompting import ChatPrompt, build_chat_prompt
from mlxcel_server.reasoning import ReasoningFormat
from mlxcel_server.responses_api.conversation import chat_request, input_messages, reply_message
from mlxcel_server.responses_api.events import StreamTarget, response_events
from mlxcel_server.responses_api.objects import (
    OutputItem,
    ReasoningItem,
    ReasoningTextPart,
    ResponseObject,
    ResponseText,
    finish_response,
    make_item_id,
    make_output,
    response_status,
)
from mlxcel_server.responses_api.request import ResponseRequest
from mlxcel_server.responses_api.store import ResponseStore, StoredResponse
from mlxcel_server.schemas import ChatMessage
from mlxcel_server.settings import ServerSettings
from mlxcel_server.sse import sse_response
from mlxcel_server.state import ServerState
from mlxcel_server.tools.pairing import RESPONSES_TERMS
from mlxcel_server.tools.reader import read_reply
from mlxcel_server.validation import parse_body


def _check_fields(body: ResponseRequest) -> None:
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise invalid(
            f"max_output_tokens must be >= 1, got {body.max_output_tokens}", "max_output_tokens"
        )


def _previous_messages(store: ResponseStore, previous_id: str | None) -> tuple[ChatMessage, ...]:
    if previous_id is None:
        return ()
    entry = store.get(previous_id)
    if entry is None:
        raise invalid(
            f"no stored response with id {previous_id!r}; it was not stored or has been evicted",
            "previous_response_id",
            code="previous_response_not_found",
        )
    return entry.conversation


def _draft(body: ResponseRequest, model_id: str, prompt: ChatPrompt) -> ResponseObject:
    """The response as it starts: in progress, no output, the request's settings echoed."""
    text_format = None if body.text is None else body.text.format
    text = ResponseText()
    if text_format is not None:
        text = ResponseText(format=text_format.model_dump(by_alias=True, exclude_none=True))
    tool_choice = body.tool_choice or ("auto" if body.tools else "none")
    return ResponseObject(
        id=f"resp_{uuid.uuid4().hex}",
        created_at=int(time.time()),
        status="in_progress",
        model=model_id,
        output=[],
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        previous_response_id=body.previous_response_id,
        temperature=body.temperature,
        top_p=body.top_p,
        store=body.store,
        text=text,
        tools=[tool.model_dump(exclude_none=True) for tool in body.tools or ()],
        tool_choice=tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(),
        parallel_tool_calls=(
            prompt.tool_use.parallel
            if prompt.tool_use is not None
            else body.parallel_tool_calls is not False
        ),
    )


def _output(result: ChoiceResult, prompt: ChatPrompt) -> list[OutputItem]:
    """A finished reply's output items, its text read for tool calls."""
    reasoning = None
    if result.reasoning:
        part = ReasoningTextPart(text=result.reasoning)
        reasoning = ReasoningItem(id=make_item_id("rs"), status="completed", content=[part])
    text, calls = result.text, ()
    if prompt.tool_use is not None:
        use = prompt.tool_use
        reply = read_reply(text, use.tool_format, parallel=use.parallel)
        text, calls = reply.content or "", reply.tool_calls
    return make_output(
        text,
        [(call.name, call.arguments) for call in calls],
        status=response_status(result.finish_reason),
        reasoning=reasoning,
    )


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    """The Responses API routes, with this app's own store of responses."""
    blueprint = Blueprint("responses", __name__)
    store = ResponseStore()
    # Reasoning has its own output item here: there is no raw text to keep beside it.
    reasoning_format = settings.reasoning_format
    if reasoning_format is ReasoningFormat.DEEPSEEK_LEGACY:
        reasoning_format = ReasoningFormat.DEEPSEEK

    @blueprint.post("/v1/responses")
    @blueprint.post("/responses")
    async def create_response() -> Response:
        body = await parse_body(ResponseRequest)
        model = state.require_model()
        _check_fields(body)
        messages = _previous_messages(store, body.previous_response_id) + input_messages(body)
        chat = chat_request(body, messages)
        prompt = await build_chat_prompt(
            model,
            chat,
            image_decoder=settings.image_decoder,
            reasoning_format=reasoning_format,
            reasoning_budget=settings.reasoning_budget,
            param="input",
            format_param="text.format",
            tool_terms=RESPONSES_TERMS,
        )
        prepared = generation.prepare(
            [prompt.ids],
            chat,
            model,
            settings,
            id_prefix="resp",
            grammar=prompt.grammar,
            reasoning=prompt.reasoning,
            prompt_images=[prompt.images],
            keep_special_tokens=prompt.keep_special_tokens,
        )
        draft = _draft(body, model.model_id, prompt)

        def keep(response: ResponseObject) -> None:
            if body.store:
                reply = reply_message(response.output)
                store.put(StoredResponse(response, (*messages, reply)))

        if body.stream:
            target = StreamTarget(draft, len(prompt.ids), keep, prompt.reasoning, prompt.tool_use)
            return sse_response(response_events(target, await generation.stream(model, prepared)))
        (result,) = await generation.collect(model, prepared)
        response = finish_response(
            draft,
            output=_output(result, prompt),
            finish_reason=result.finish_reason,
            input_tokens=len(prompt.ids),
            stats=result.stats,
            reasoning_tokens=result.reasoning_tokens,
        )
        keep(response)
        return jsonify(response.model_dump(mode="json"))

    @blueprint.get("/v1/responses/<response_id>")
    @blueprint.get("/responses/<response_id>")
    async def get_response(response_id: str) -> Response:
        entry = store.get(response_id)
        if entry is None:
            raise ApiError(404, f"no response with id {response_id!r}", param="response_id")
        return jsonify(entry.response.model_dump(mode="json"))

    return blueprint
