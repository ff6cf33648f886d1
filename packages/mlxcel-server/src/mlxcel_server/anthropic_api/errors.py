"""Anthropic-shaped errors: `{"type": "error", "error": {"type": ..., "message": ...}}`.

The same `ApiError` the OpenAI routes raise is rendered this way on the Anthropic routes.
A server that cannot take a request now (loading, a full queue, shutting down) answers
Anthropic's 529 `overloaded_error` where the OpenAI routes answer 503; Anthropic's clients
retry it, honouring `Retry-After`.
"""

from __future__ import annotations

from types import MappingProxyType

from mlxcel_server.errors import ApiError

OVERLOADED_STATUS = 529
_STATUSES = MappingProxyType({503: OVERLOADED_STATUS})
_TYPES = MappingProxyType(
    {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        501: "api_error",
        OVERLOADED_STATUS: "overloaded_error",
    }
)


def is_anthropic_path(path: str) -> bool:
    """Whether `path` is under the Anthropic routes (`/v1/messages...`, `/messages...`)."""
    path = path.removeprefix("/v1")
    return path == "/messages" or path.startswith("/messages/")


def anthropic_status(error: ApiError) -> int:
    """The HTTP status of `error` on an Anthropic route."""
    return _STATUSES.get(error.status, error.status)


def anthropic_error_body(error: ApiError) -> dict:
    """The Anthropic error object for `error`."""
    error_type = _TYPES.get(anthropic_status(error), "invalid_request_error")
    return {"type": "error", "error": {"type": error_type, "message": error.message}}
