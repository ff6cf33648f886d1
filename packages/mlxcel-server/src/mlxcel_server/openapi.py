"""The OpenAPI 3.1 document served at `/openapi.json`, built from the pydantic models.

One table maps each operation to its request and response models; the schemas themselves
come from `pydantic.json_schema.models_json_schema`, so the document cannot drift from the
validation the handlers run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from mlxcel_server.anthropic_api.errors import OVERLOADED_STATUS
from mlxcel_server.anthropic_api.objects import MessageObject
from mlxcel_server.anthropic_api.request import CountTokensRequest, MessagesRequest
from mlxcel_server.native_completion import NativeCompletion, NativeCompletionRequest
from mlxcel_server.responses import ChatCompletion, Completion, LoraAdapterList
from mlxcel_server.responses_api.objects import ResponseObject
from mlxcel_server.responses_api.request import ResponseRequest
from mlxcel_server.schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoraScales,
    TokenizeRequest,
)
from mlxcel_server.version import server_version

_REF_TEMPLATE = "#/components/schemas/{model}"


class ErrorObject(BaseModel):
    """The body of every 4xx and 5xx answer, as `ApiError.body` writes it."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorObject


class AnthropicErrorObject(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """The body of every error answer on the Anthropic routes."""

    type: Literal["error"]
    error: AnthropicErrorObject


class TokenCount(BaseModel):
    input_tokens: int


@dataclass(frozen=True)
class Operation:
    """One documented operation.

    Args:
        paths: the paths serving it (OpenAI's `/v1/...` and llama-server's unversioned one).
        method: the HTTP method, lower case.
        summary: one line for the document.
        request: the JSON body's model, if the operation takes one.
        response: the 200 JSON body's model, if one exists.
        streams: whether `stream: true` answers with server-sent events instead.
        media_type: the 200 body's media type where it is not described by a model.
        errors: the error statuses the operation may answer with.
        error_body: the model of its error bodies.
    """

    paths: tuple[str, ...]
    method: Literal["get", "post"]
    summary: str
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    streams: bool = False
    media_type: str = "application/json"
    errors: tuple[int, ...] = (400, 401, 404, 413, 415, 503)
    error_body: type[BaseModel] = ErrorResponse


_GENERATION_ERRORS = (400, 401, 413, 415, 500, 503)

OPERATIONS = (
    Operation(
        ("/v1/chat/completions", "/chat/completions"),
        "post",
        "Create a chat completion",
        ChatCompletionRequest,
        ChatCompletion,
        streams=True,
        errors=_GENERATION_ERRORS,
    ),
    Operation(
        ("/v1/completions", "/completions"),
        "post",
        "Create a completion",
        CompletionRequest,
        Completion,
        streams=True,
        errors=_GENERATION_ERRORS,
    ),
    Operation(
        ("/completion",),
        "post",
        "Create a completion (llama-server's own API)",
        NativeCompletionRequest,
        NativeCompletion,
        streams=True,
        errors=_GENERATION_ERRORS,
    ),
    Operation(
        ("/v1/responses", "/responses"),
        "post",
        "Create a response (Responses API)",
        ResponseRequest,
        ResponseObject,
        streams=True,
        errors=_GENERATION_ERRORS,
    ),
    Operation(
        ("/v1/messages", "/messages"),
        "post",
        "Create a message (Anthropic Messages API)",
        MessagesRequest,
        MessageObject,
        streams=True,
        errors=(400, 401, 413, 415, 500, OVERLOADED_STATUS),
        error_body=AnthropicErrorResponse,
    ),
    Operation(
        ("/v1/messages/count_tokens", "/messages/count_tokens"),
        "post",
        "Count a message request's prompt tokens (Anthropic Messages API)",
        CountTokensRequest,
        TokenCount,
        errors=(400, 401, 413, 415, OVERLOADED_STATUS),
        error_body=AnthropicErrorResponse,
    ),
    Operation(
        ("/v1/responses/{response_id}", "/responses/{response_id}"),
        "get",
        "Fetch a stored response",
        response=ResponseObject,
        errors=(401, 404),
    ),
    Operation(("/tokenize",), "post", "Tokenize text", TokenizeRequest),
    Operation(("/detokenize",), "post", "Turn token ids back into text", DetokenizeRequest),
    Operation(
        ("/apply-template",), "post", "Render messages with the chat template", ApplyTemplateRequest
    ),
    Operation(("/v1/models", "/models"), "get", "List the served model", errors=(401, 503)),
    Operation(
        ("/v1/models/{model_id}", "/models/{model_id}"),
        "get",
        "Describe a model (any name other than a speech model's is the text model)",
        errors=(401, 503),
    ),
    Operation(("/health",), "get", "Whether the model is loaded", errors=(503,)),
    Operation(("/props",), "get", "Server properties (llama-server)", errors=(401, 503)),
    Operation(("/props",), "post", "Change server properties (not supported)", errors=(401, 501)),
    Operation(
        ("/lora-adapters",),
        "get",
        "List the LoRA adapters and their global scales",
        response=LoraAdapterList,
        errors=(401, 503),
    ),
    Operation(
        ("/lora-adapters",), "post", "Set the LoRA adapters' global scales", request=LoraScales
    ),
    Operation(("/slots",), "get", "Slot state (with --slots)", errors=(401, 501, 503)),
    Operation(
        ("/metrics",),
        "get",
        "Prometheus metrics (with --metrics)",
        media_type="text/plain",
        errors=(401, 501, 503),
    ),
    *(
        Operation(
            (f"/v1/audio/{name}", f"/audio/{name}"),
            "post",
            f"Audio {name} (OpenAI; 501 without a speech model)",
            errors=(400, 401, 404, 413, 501, 503),
        )
        for name in ("speech", "transcriptions", "translations")
    ),
    Operation(("/openapi.json",), "get", "This document", errors=(401,)),
)


def _path_parameters(path: str) -> list[dict[str, Any]]:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    return [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names
    ]


def _operation(operation: Operation, refs: dict[tuple[Any, JsonSchemaMode], Any]) -> dict:
    success: dict[str, Any] = {"description": "Success"}
    if operation.response is not None:
        content = {"application/json": {"schema": refs[(operation.response, "serialization")]}}
    else:
        content = {operation.media_type: {"schema": {}}}
    if operation.streams:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    success["content"] = content
    error = {
        "description": "An error object",
        "content": {"application/json": {"schema": refs[(operation.error_body, "serialization")]}},
    }
    document: dict[str, Any] = {
        "summary": operation.summary,
        "responses": {"200": success, **{str(status): error for status in operation.errors}},
    }
    if operation.request is not None:
        document["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": refs[(operation.request, "validation")]}},
        }
    return document


def make_openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route the app serves.

    Returns:
        The document as a JSON-ready dict; request bodies use each model's validation schema,
        responses its serialization schema.
    """
    inputs: list[tuple[type[BaseModel], JsonSchemaMode]] = []
    for operation in OPERATIONS:
        inputs.append((operation.error_body, "serialization"))
        if operation.request is not None:
            inputs.append((operation.request, "validation"))
        if operation.response is not None:
            inputs.append((operation.response, "serialization"))
    refs, definitions = models_json_schema(inputs, ref_template=_REF_TEMPLATE)
    paths: dict[str, dict[str, Any]] = {}
    for operation in OPERATIONS:
        for path in operation.paths:
            entry = _operation(operation, refs)
            parameters = _path_parameters(path)
            if parameters:
                entry["parameters"] = parameters
            paths.setdefault(path, {})[operation.method] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": "mlxcel server", "version": server_version()},
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "api_key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        "security": [{}, {"bearer": []}, {"api_key": []}],
    }
