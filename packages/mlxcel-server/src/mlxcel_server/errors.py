"""OpenAI-shaped errors: one exception type, rendered as `{"error": {...}}` with its status."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from mlxcel_core.errors import MlxcelError

_TYPES = MappingProxyType(
    {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        405: "invalid_request_error",
        413: "invalid_request_error",
        415: "invalid_request_error",
        500: "server_error",
        501: "not_supported_error",
        503: "unavailable_error",
    }
)


class ApiError(MlxcelError):
    """An error answered to the client.

    Args:
        status: the HTTP status.
        message: one line for the client.
        param: the request field at fault, if any.
        code: a machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
        headers: extra response headers (e.g. `Retry-After`).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        """The OpenAI error object."""
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 naming the field at fault."""
    return ApiError(400, message, param=param, code=code)
