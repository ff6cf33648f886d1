"""The Responses API event stream: named SSE events, each with its `sequence_number`.

The order is OpenAI's for one text message: `response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`
(one per engine output with text), `response.output_text.done`, `response.content_part.done`,
`response.output_item.done`, then `response.completed` or `response.incomplete`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from mlxcel_core.engine import EngineOutput
from mlxcel_server.errors import ApiError
from mlxcel_server.responses_api.objects import (
    OutputMessage,
    OutputTextPart,
    ResponseObject,
    finish_response,
)


def encode_named_event(event_type: str, data: dict) -> bytes:
    """One SSE block with an `event:` line; JSON keeps non-ASCII text as it is (UTF-8)."""
    payload = json.dumps({"type": event_type, **data}, ensure_ascii=False)
    return f"event: {event_type}\ndata: {payload}\n\n".encode()


@dataclass(frozen=True)
class StreamTarget:
    """Where the streamed text goes.

    Attributes:
        draft: the response as it starts (`in_progress`, no output).
        message_id: the id of its output message.
        input_tokens: prompt tokens.
        on_finish: called with the finished response, before the final event is sent.
    """

    draft: ResponseObject
    message_id: str
    input_tokens: int
    on_finish: Callable[[ResponseObject], None]


async def response_events(
    target: StreamTarget, outputs: AsyncIterator[EngineOutput]
) -> AsyncIterator[bytes]:
    """Encoded events for one response whose single choice arrives as `outputs`.

    A generation error ends the stream with an `error` event. The opening events are sent
    with the first output, once prefill is done.
    """
    sequence = 0

    def event(event_type: str, **data) -> bytes:
        nonlocal sequence
        block = encode_named_event(event_type, {**data, "sequence_number": sequence})
        sequence += 1
        return block

    draft = target.draft.model_dump(mode="json")
    part = {"output_index": 0, "item_id": target.message_id, "content_index": 0}
    opening = OutputMessage(id=target.message_id, status="in_progress", content=[])
    texts: list[str] = []
    finish_reason, stats = "stop", None
    try:
        # Closed on exit so that the engine request is cancelled at once when the client goes.
        async with contextlib.aclosing(outputs):
            async for output in outputs:
                # The opening events wait for the first output: the engine request is
                # cancelled in the iterator's `finally`, which an iterator never started
                # (a client gone during the opening events) would not reach.
                if sequence == 0:
                    yield event("response.created", response=draft)
                    yield event("response.in_progress", response=draft)
                    yield event(
                        "response.output_item.added", output_index=0, item=opening.model_dump()
                    )
                    yield event(
                        "response.content_part.added",
                        **part,
                        part=OutputTextPart(text="").model_dump(),
                    )
                if output.text:
                    texts.append(output.text)
                    yield event(
                        "response.output_text.delta", **part, delta=output.text, logprobs=[]
                    )
                if output.finish_reason is not None and output.stats is not None:
                    finish_reason = output.finish_reason
                    stats = output.stats
    except ApiError as error:
        yield event("error", code=error.code, message=error.message, param=error.param)
        return
    # The engine ends every choice with a finish reason and statistics, or an error.
    assert stats is not None
    response = finish_response(
        target.draft,
        message_id=target.message_id,
        text="".join(texts),
        finish_reason=finish_reason,
        input_tokens=target.input_tokens,
        stats=stats,
    )
    target.on_finish(response)
    (message,) = response.output
    (text_part,) = message.content
    yield event("response.output_text.done", **part, text=text_part.text, logprobs=[])
    yield event("response.content_part.done", **part, part=text_part.model_dump())
    yield event("response.output_item.done", output_index=0, item=message.model_dump())
    final_type = f"response.{response.status}"
    yield event(final_type, response=response.model_dump(mode="json"))
