"""The Responses API event stream: named SSE events, each with its `sequence_number`.

The order is OpenAI's: `response.created`, `response.in_progress`; when the reply reasons, a
reasoning item first (`response.output_item.added`, `response.content_part.added`,
`response.reasoning_text.delta` per piece of reasoning, `response.reasoning_text.done`,
`response.content_part.done`, `response.output_item.done`); then the message item
(`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`
per piece of text, `response.output_text.done`, `response.content_part.done`,
`response.output_item.done`), then `response.completed` or `response.incomplete`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from mlxcel_core.engine import EngineOutput
from mlxcel_server.errors import ApiError
from mlxcel_server.reasoning import ReasoningPlan, ReplyReader
from mlxcel_server.responses_api.objects import (
    OutputMessage,
    OutputTextPart,
    ReasoningItem,
    ReasoningTextPart,
    ResponseObject,
    finish_response,
    message_of,
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
        reasoning: how the reply is read for reasoning, or None for plain text.
        reasoning_id: the id of its reasoning item, if it reasons.
    """

    draft: ResponseObject
    message_id: str
    input_tokens: int
    on_finish: Callable[[ResponseObject], None]
    reasoning: ReasoningPlan | None = None
    reasoning_id: str = ""


class _Items:
    """The output items opened so far, and the events that open and close them."""

    def __init__(self, target: StreamTarget) -> None:
        self.target = target
        self.sequence = 0
        self.reasoning: list[str] | None = None
        self.message_open = False

    def event(self, event_type: str, **data) -> bytes:
        block = encode_named_event(event_type, {**data, "sequence_number": self.sequence})
        self.sequence += 1
        return block

    def reasoning_part(self) -> dict:
        return {"output_index": 0, "item_id": self.target.reasoning_id, "content_index": 0}

    def message_part(self) -> dict:
        output_index = 0 if self.reasoning is None else 1
        return {"output_index": output_index, "item_id": self.target.message_id, "content_index": 0}

    def reasoning_delta(self, text: str) -> list[bytes]:
        events = []
        if self.reasoning is None:
            self.reasoning = []
            opening = ReasoningItem(id=self.target.reasoning_id, status="in_progress", content=[])
            events.append(
                self.event("response.output_item.added", output_index=0, item=opening.model_dump())
            )
            part = ReasoningTextPart(text="").model_dump()
            events.append(
                self.event("response.content_part.added", **self.reasoning_part(), part=part)
            )
        self.reasoning.append(text)
        events.append(
            self.event("response.reasoning_text.delta", **self.reasoning_part(), delta=text)
        )
        return events

    def open_message(self) -> list[bytes]:
        if self.message_open:
            return []
        self.message_open = True
        events = self.close_reasoning()
        part = self.message_part()
        opening = OutputMessage(id=self.target.message_id, status="in_progress", content=[])
        events.append(
            self.event(
                "response.output_item.added",
                output_index=part["output_index"],
                item=opening.model_dump(),
            )
        )
        events.append(
            self.event(
                "response.content_part.added", **part, part=OutputTextPart(text="").model_dump()
            )
        )
        return events

    def reasoning_item(self) -> ReasoningItem | None:
        if self.reasoning is None:
            return None
        text = "".join(self.reasoning)
        return ReasoningItem(
            id=self.target.reasoning_id, status="completed", content=[ReasoningTextPart(text=text)]
        )

    def close_reasoning(self) -> list[bytes]:
        item = self.reasoning_item()
        if item is None:
            return []
        (part,) = item.content
        return [
            self.event("response.reasoning_text.done", **self.reasoning_part(), text=part.text),
            self.event(
                "response.content_part.done", **self.reasoning_part(), part=part.model_dump()
            ),
            self.event("response.output_item.done", output_index=0, item=item.model_dump()),
        ]


async def response_events(
    target: StreamTarget, outputs: AsyncIterator[EngineOutput]
) -> AsyncIterator[bytes]:
    """Encoded events for one response whose single choice arrives as `outputs`.

    A generation error ends the stream with an `error` event. The opening events are sent
    with the first output, once prefill is done.
    """
    items = _Items(target)
    reader = ReplyReader(target.reasoning)
    draft = target.draft.model_dump(mode="json")
    texts: list[str] = []
    finish_reason, stats = "stop", None
    try:
        # Closed on exit so that the engine request is cancelled at once when the client goes.
        async with contextlib.aclosing(outputs):
            async for output in outputs:
                # The opening events wait for the first output: the engine request is
                # cancelled in the iterator's `finally`, which an iterator never started
                # (a client gone during the opening events) would not reach.
                if items.sequence == 0:
                    yield items.event("response.created", response=draft)
                    yield items.event("response.in_progress", response=draft)
                delta = reader.read(output)
                if delta.reasoning:
                    for block in items.reasoning_delta(delta.reasoning):
                        yield block
                if delta.content:
                    for block in items.open_message():
                        yield block
                    texts.append(delta.content)
                    yield items.event(
                        "response.output_text.delta",
                        **items.message_part(),
                        delta=delta.content,
                        logprobs=[],
                    )
                if output.finish_reason is not None and output.stats is not None:
                    finish_reason = output.finish_reason
                    stats = output.stats
    except ApiError as error:
        yield items.event("error", code=error.code, message=error.message, param=error.param)
        return
    # The engine ends every choice with a finish reason and statistics, or an error.
    assert stats is not None
    for block in items.open_message():
        yield block
    response = finish_response(
        target.draft,
        message_id=target.message_id,
        text="".join(texts),
        finish_reason=finish_reason,
        input_tokens=target.input_tokens,
        stats=stats,
        reasoning=items.reasoning_item(),
        reasoning_tokens=reader.num_reasoning_tokens,
    )
    target.on_finish(response)
    message = message_of(response)
    (text_part,) = message.content
    part = items.message_part()
    yield items.event("response.output_text.done", **part, text=text_part.text, logprobs=[])
    yield items.event("response.content_part.done", **part, part=text_part.model_dump())
    yield items.event(
        "response.output_item.done", output_index=part["output_index"], item=message.model_dump()
    )
    final_type = f"response.{response.status}"
    yield items.event(final_type, response=response.model_dump(mode="json"))
