"""Server-sent events as OpenAI streams them: `data: <json>` blocks, then `data: [DONE]`;
and the named events of the Messages and Responses streams."""

from __future__ import annotations

import json

from pydantic import BaseModel
from quart import Response

DONE = b"data: [DONE]\n\n"


def encode_event(payload: BaseModel | dict) -> bytes:
    """One SSE `data:` block; JSON keeps non-ASCII text as it is (UTF-8)."""
    data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def encode_named_event(event_type: str, data: dict) -> bytes:
    """One SSE block with an `event:` line naming it, as the Anthropic Messages and OpenAI
    Responses streams send them; `data` gains the `type` field. JSON keeps non-ASCII text
    as it is (UTF-8)."""
    payload = json.dumps({"type": event_type, **data}, ensure_ascii=False)
    return f"event: {event_type}\ndata: {payload}\n\n".encode()


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
