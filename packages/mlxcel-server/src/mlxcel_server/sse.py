"""Server-sent events as OpenAI streams them: `data: <json>` blocks, then `data: [DONE]`."""

from __future__ import annotations

import json

from pydantic import BaseModel
from quart import Response

DONE = b"data: [DONE]\n\n"


def encode_event(payload: BaseModel | dict) -> bytes:
    """One SSE `data:` block; JSON keeps non-ASCII text as it is (UTF-8)."""
    data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def sse_response(events) -> Response:
    """A streaming response over an async iterator of encoded events."""
    response = Response(
        events,
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    # Generation may take longer than Quart's default response timeout.
    response.timeout = None
    return response
