"""`POST /v1/responses` and `GET /v1/responses/{id}` (and their unversioned paths)."""

from __future__ import annotations

import time
import uuid

from quart import Blueprint, Response, jsonify

from mlxcel_models.tokenizer.reasoning import find_reasoning_syntax
from mlxcel_server import generation
from mlxcel_server.errors import ApiError, invalid
from mlxcel_server.reasoning import ReasoningFormat, make_plan, template_kwargs
from mlxcel_server.responses_api.conversation import ChatTurn, input_turns, make_chat
from mlxcel_server.responses_api.events import StreamTarget, response_events
from mlxcel_server.responses_api.objects import (
    ReasoningItem,
    ReasoningTextPart,
    ResponseObject,
    ResponseText,
    finish_response,
    message_of,
)
from mlxcel_server.responses_api.request import ResponseRequest, TextFormat
from mlxcel_server.responses_api.store import ResponseStore, StoredResponse
from mlxcel_server.routes.chat import encode_messages
from mlxcel_server.schemas import GenerationFields
from mlxcel_server.settings import ServerSettings
from mlxcel_server.sse import sse_response
from mlxcel_server.state import ServerState
from mlxcel_server.validation import parse_body


def _check_fields(body: ResponseRequest) -> None:
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise invalid(
            f"max_output_tokens must be >= 1, got {body.max_output_tokens}", "max_output_tokens"
        )


def _previous_turns(store: ResponseStore, previous_id: str | None) -> tuple[ChatTurn, ...]:
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


def _text_format(body: ResponseRequest) -> TextFormat | None:
    return None if body.text is None else body.text.format


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    """The Responses API routes, with this app's own store of responses."""
    blueprint = Blueprint("responses", __name__)
    store = ResponseStore()

    @blueprint.post("/v1/responses")
    @blueprint.post("/responses")
    async def create_response() -> Response:
        body = await parse_body(ResponseRequest)
        model = state.require_model()
        generation.check_model_name(model, body.model)
        _check_fields(body)
        turns = _previous_turns(store, body.previous_response_id) + input_turns(body)
        tokenizer = model.loaded.tokenizer
        syntax = find_reasoning_syntax(tokenizer)
        budget = settings.reasoning_budget
        kwargs = template_kwargs(None, syntax, budget)
        prompt = await encode_messages(
            model,
            make_chat(body.instructions, turns),
            image_decoder=settings.image_decoder,
            template_kwargs=kwargs,
            param="input",
        )
        ids = list(prompt.prompt_ids)
        generation.check_prompt(ids, model.context_size, "input")
        # Reasoning has its own output item here: there is no raw text to keep beside it.
        reasoning_format = settings.reasoning_format
        if reasoning_format is ReasoningFormat.DEEPSEEK_LEGACY:
            reasoning_format = ReasoningFormat.DEEPSEEK
        plan = make_plan(syntax, reasoning_format, budget, tokenizer, ids)
        text_format = _text_format(body)
        fields = GenerationFields(
            model=body.model,
            max_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            response_format=None if text_format is None else text_format.response_format(),
        )
        prepared = generation.prepare(
            [ids],
            fields,
            model,
            settings,
            id_prefix="resp",
            format_param="text.format",
            reasoning=plan,
            prompt_images=[prompt.images],
        )
        text = ResponseText()
        if text_format is not None:
            text = ResponseText(format=text_format.model_dump(by_alias=True, exclude_none=True))
        draft = ResponseObject(
            id=f"resp_{uuid.uuid4().hex}",
            created_at=int(time.time()),
            status="in_progress",
            model=model.model_id,
            output=[],
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            previous_response_id=body.previous_response_id,
            temperature=body.temperature,
            top_p=body.top_p,
            store=body.store,
            text=text,
        )
        message_id = f"msg_{uuid.uuid4().hex}"
        reasoning_id = f"rs_{uuid.uuid4().hex}"

        def keep(response: ResponseObject) -> None:
            if body.store:
                reply = ChatTurn("assistant", message_of(response).content[0].text)
                store.put(StoredResponse(response, (*turns, reply)))

        if body.stream:
            target = StreamTarget(draft, message_id, len(ids), keep, plan, reasoning_id)
            return sse_response(response_events(target, await generation.stream(model, prepared)))
        (result,) = await generation.collect(model, prepared)
        response = finish_response(
            draft,
            message_id=message_id,
            text=result.text,
            finish_reason=result.finish_reason,
            input_tokens=len(ids),
            stats=result.stats,
            reasoning=(
                ReasoningItem(
                    id=reasoning_id,
                    status="completed",
                    content=[ReasoningTextPart(text=result.reasoning)],
                )
                if result.reasoning
                else None
            ),
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
