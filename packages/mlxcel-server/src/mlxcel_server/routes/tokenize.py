"""llama-server's `POST /tokenize`, `POST /detokenize` and `POST /apply-template`.

Token pieces come from each token's exact bytes (llguidance's view of the tokenizer, the one
constrained decoding uses), so a token holding part of a character is given as its bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from quart import Blueprint, Response, jsonify

from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server.errors import invalid
from mlxcel_server.generation import check_token_ids
from mlxcel_server.image_prompts import require_prompter
from mlxcel_server.schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest
from mlxcel_server.state import ServerState
from mlxcel_server.structured import grammar_tokenizer
from mlxcel_server.validation import parse_body


def token_pieces(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str | list[int]]:
    """Each token's piece as llama-server's `/tokenize` gives it: its text where its bytes
    are whole UTF-8, else the list of its bytes (a part of a character); a special token's
    text as written."""
    exact = grammar_tokenizer(tokenizer)
    pieces: list[str | list[int]] = []
    for token_id in ids:
        if exact.is_special_token(token_id):
            pieces.append(tokenizer.decode([token_id], skip_special_tokens=False))
            continue
        data = exact.decode_bytes([token_id])
        try:
            pieces.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            pieces.append(list(data))
    return pieces


def make_blueprint(state: ServerState) -> Blueprint:
    blueprint = Blueprint("tokenize", __name__)

    @blueprint.post("/tokenize")
    async def tokenize() -> Response:
        body = await parse_body(TokenizeRequest)
        tokenizer = state.require_model().loaded.tokenizer
        tokens = await asyncio.to_thread(
            tokenizer.encode, body.content, add_special_tokens=body.add_special
        )
        if not body.with_pieces:
            return jsonify({"tokens": tokens})
        pieces = await asyncio.to_thread(token_pieces, tokenizer, tokens)
        return jsonify(
            {"tokens": [{"id": t, "piece": p} for t, p in zip(tokens, pieces, strict=True)]}
        )

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
