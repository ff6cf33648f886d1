"""Parsing a request body into a pydantic model, with OpenAI-shaped 400/415 errors."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, RootModel, ValidationError
from quart import request

from mlxcel_server.errors import ApiError, invalid

Model = TypeVar("Model", bound=BaseModel)
ListModel = TypeVar("ListModel", bound=RootModel)


def _param(location: tuple) -> str:
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _without_union_tags(location: tuple) -> tuple:
    """`location` less the tag pydantic puts after a discriminated union's member (the
    `image_url` of `content[0].image_url.image_url.detail`)."""
    kept: list = []
    tag_next = False
    for part in location:
        if isinstance(part, str) and "tagged-union[" in part:
            tag_next = True
        elif tag_next and not isinstance(part, int):
            tag_next = False
            continue
        kept.append(part)
    return tuple(kept)


def _message(error: ValidationError) -> tuple[str, str]:
    # Of a union's failed members, the one that got furthest into the value says most
    # (an image part's bad `detail`, not "content should be a string").
    first = max(error.errors(include_url=False), key=lambda each: len(each["loc"]))
    # Union members each report the field; the first member's name suffices.
    location = tuple(
        part
        for part in _without_union_tags(first["loc"])
        if not (isinstance(part, str) and "[" in part)
    )
    location = tuple(p for p in location if p not in ("str", "list", "float", "bool", "int"))
    param = _param(location)
    if first["type"] == "extra_forbidden":
        return f"unsupported parameter '{param}': mlxcel does not implement it", param
    return f"{param}: {first['msg']}" if param else first["msg"], param


async def parse_body(model: type[Model]) -> Model:
    """Parse the JSON body of the current request as `model`.

    Raises:
        ApiError: 415 when the body is not declared as JSON; 400 when it is empty, not
            JSON, not an object, or fails validation (naming the field).
    """
    body = await _json_body()
    if not isinstance(body, dict):
        raise invalid(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        message, param = _message(error)
        raise invalid(message, param) from error


async def parse_list_body(model: type[ListModel]) -> ListModel:
    """Parse the JSON body of the current request as `model`, a root model of a list.

    Raises:
        ApiError: 415 when the body is not declared as JSON; 400 when it is empty, not
            JSON, not an array, or an item fails validation (naming it by index).
    """
    body = await _json_body()
    if not isinstance(body, list):
        raise invalid(f"the request body must be a JSON array, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        message, param = _message(error)
        raise invalid(message, param) from error


async def _json_body() -> object:
    if request.mimetype != "application/json":
        raise ApiError(
            415,
            f"the request body must be application/json, got {request.mimetype or 'none'!r}",
        )
    data = await request.get_data()
    if not data.strip():
        raise invalid("the request body is empty; send a JSON object")
    try:
        body = json.loads(data)
        # A lone surrogate escape ("\ud800") parses, but is no text a tokenizer can take.
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except ValueError as error:  # also UnicodeError, and an integer of over 4,300 digits
        raise invalid(f"the request body is not valid JSON: {error}") from error
    except RecursionError as error:
        raise invalid("the request body is not valid JSON: it is nested too deeply") from error
    return body
