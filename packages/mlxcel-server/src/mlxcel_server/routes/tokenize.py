"""llama-server's `POST /tokenize`, `POST /detokenize` and `POST /apply-template`."""

from __future__ import annotations

import asyncio

from quart import Blueprint, Response, jsonify

from mlxcel_server.errors import invalid
from mlxcel_server.generation import check_token_ids
from mlxcel_server.image_prompts import require_prompter
from mlxcel_server.schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest
from mlxcel_server.state import ServerState
from mlxcel_server.validation import parse_body


def make_blueprint(state: ServerState) -> Blueprint:
    blueprint = Blueprint("tokenize", __name__)

    @blueprint.post("/tokenize")
    async def tokenize() -> Response:
        body = await parse_body(TokenizeRequest)
        tokenizer = state.require_model().loaded.tokenizer
        tokens = await asyncio.to_thread(
            tokenizer.encode, body.content, add_special_tokens=body.add_special
        )
        return jsonify({"tokens": tokens})

    @blueprint.post("/detokenize")
    async def detokenize() -> Response:
        body = await parse_body(DetokenizeRequest)
        tokenizer = state.require_model().loaded.tokenizer
        check_token_ids(body.tokens, tokenizer.vocab_size, "tokens")
        content = await asyncio.to_thread(tokenizer.decode, body.tokens)
        return jsonify({"content": content})

    @blueprint.post("/apply-template")
    async def apply_template() -> Response:
        body = await parse_body(ApplyTemplateRequest)
        model = state.require_model()
        if not body.messages:
            raise invalid("messages must hold at least one message", "messages")
        if any(message.image_urls() for message in body.messages):
            require_prompter(model, "messages")
        conversation = [m.template_dict() for m in body.messages]
        try:
            prompt = await asyncio.to_thread(
                model.loaded.tokenizer.apply_chat_template, conversation
            )
        except ValueError as error:
            raise invalid(str(error), "messages") from error
        return jsonify({"prompt": prompt})

    return blueprint
