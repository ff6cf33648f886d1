"""The Responses API event stream: named SSE events, each with its `sequence_number`.

The order is OpenAI's: `response.created`, `response.in_progress`; then each output item in
turn, opened with `response.output_item.added` and closed with `response.output_item.done`.
A reasoning item carries its text in `response.reasoning_text.delta`s (inside
`response.content_part.added` / `.done`, then `response.reasoning_text.done`); the message
item its text in `response.output_text.delta`s (the same way, `response.output_text.done`);
a function call item its arguments in `response.function_call_arguments.delta`s as they are
generated, then `response.function_call_arguments.done`. Last comes `response.completed` or
`response.incomplete`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from mlxcel_core.engine import EngineOutput
from mlxcel_server.errors import ApiError
from mlxcel_server.reasoning import ReasoningPlan, ReplyReader
from mlxcel_server.responses_api.objects import (
    FunctionCallItem,
    OutputItem,
    OutputMessage,
    OutputTextPart,
    ReasoningItem,
    ReasoningTextPart,
    ResponseObject,
    finish_response,
    make_item_id,
    response_status,
)
from mlxcel_server.sse import encode_named_event
from mlxcel_server.tools.reader import CallDelta, ToolCallReader
from mlxcel_server.tools.use import ToolUse, make_call_id


@dataclass(frozen=True)
class StreamTarget:
    """Where the streamed reply goes.

    Attributes:
        draft: the response as it starts (`in_progress`, no output).
        input_tokens: prompt tokens.
        on_finish: called with the finished response, before the final event is sent.
        reasoning: how the reply is read for reasoning, or None for plain text.
        tool_use: how the reply is read for tool calls, or None without tools.
    """

    draft: ResponseObject
    input_tokens: int
    on_finish: Callable[[ResponseObject], None]
    reasoning: ReasoningPlan | None = None
    tool_use: ToolUse | None = None


class _Items:
    """The output items opened so far, and the events that open, fill and close them."""

    def __init__(self) -> None:
        self.sequence = 0
        self.items: list[OutputItem] = []
        self._texts: list[str] = []  # the open item's text (reasoning, message or arguments)
        self._open: str | None = None

    def event(self, event_type: str, **data) -> bytes:
        block = encode_named_event(event_type, {**data, "sequence_number": self.sequence})
        self.sequence += 1
        return block

    def _where(self) -> dict:
        return {"output_index": len(self.items) - 1, "item_id": self.items[-1].id}

    def _open_item(self, kind: str, item: OutputItem) -> list[bytes]:
        events = self.close()
        self.items.append(item)
        self._open, self._texts = kind, []
        opened = item.model_dump(mode="json")
        events.append(
            self.event("response.output_item.added", output_index=len(self.items) - 1, item=opened)
        )
        if kind == "reasoning":
            part = ReasoningTextPart(text="").model_dump()
            events.append(self.event("response.content_part.added", **self._part(), part=part))
        elif kind == "message":
            part = OutputTextPart(text="").model_dump()
            events.append(self.event("response.content_part.added", **self._part(), part=part))
        return events

    def _part(self) -> dict:
        return {**self._where(), "content_index": 0}

    def reasoning(self, text: str) -> list[bytes]:
        if not text:
            return []
        events = []
        if self._open != "reasoning":
            item = ReasoningItem(id=make_item_id("rs"), status="in_progress", content=[])
            events += self._open_item("reasoning", item)
        self._texts.append(text)
        return [*events, self.event("response.reasoning_text.delta", **self._part(), delta=text)]

    def text(self, text: str) -> list[bytes]:
        if not text:
            return []
        events = [] if self._open == "message" else self.open_message()
        self._texts.append(text)
        return [
            *events,
            self.event("response.output_text.delta", **self._part(), delta=text, logprobs=[]),
        ]

    def open_message(self) -> list[bytes]:
        item = OutputMessage(id=make_item_id("msg"), status="in_progress", content=[])
        return self._open_item("message", item)

    def call(self, delta: CallDelta) -> list[bytes]:
        events = []
        if delta.name is not None:
            item = FunctionCallItem(
                id=make_item_id("fc"),
                call_id=make_call_id(),
                name=delta.name,
                arguments="",
                status="in_progress",
            )
            events += self._open_item("function_call", item)
        if delta.arguments:
            self._texts.append(delta.arguments)
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    **self._where(),
                    delta=delta.arguments,
                )
            )
        return events

    def num_calls(self) -> int:
        return sum(isinstance(item, FunctionCallItem) for item in self.items)

    def close(self, status: str = "completed") -> list[bytes]:
        """Events closing the open item, which takes its final form."""
        if self._open is None:
            return []
        text, item = "".join(self._texts), self.items[-1]
        self._open = None
        events = []
        if isinstance(item, ReasoningItem):
            part = ReasoningTextPart(text=text)
            item = item.model_copy(update={"status": "completed", "content": [part]})
            events += [
                self.event("response.reasoning_text.done", **self._part(), text=text),
                self.event("response.content_part.done", **self._part(), part=part.model_dump()),
            ]
        elif isinstance(item, OutputMessage):
            part = OutputTextPart(text=text)
            item = item.model_copy(update={"status": status, "content": [part]})
            events += [
                self.event("response.output_text.done", **self._part(), text=text, logprobs=[]),
                self.event("response.content_part.done", **self._part(), part=part.model_dump()),
            ]
        elif isinstance(item, FunctionCallItem):
            item = item.model_copy(update={"status": status, "arguments": text})
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    **self._where(),
                    name=item.name,
                    arguments=text,
                )
            )
        self.items[-1] = item
        done = item.model_dump(mode="json")
        output_index = len(self.items) - 1
        events.append(self.event("response.output_item.done", output_index=output_index, item=done))
        return events


async def response_events(
    target: StreamTarget, outputs: AsyncIterator[EngineOutput]
) -> AsyncIterator[bytes]:
    """Encoded events for one response whose single choice arrives as `outputs`.

    A generation error ends the stream with an `error` event. The opening events are sent
    with the first output, once prefill is done.
    """
    items = _Items()
    reader = ReplyReader(target.reasoning)
    tool_use = target.tool_use
    calls_reader = (
        None
        if tool_use is None
        else ToolCallReader(tool_use.tool_format, parallel=tool_use.parallel)
    )
    draft = target.draft.model_dump(mode="json")
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
                text, calls = delta.content, ()
                if calls_reader is not None:
                    read = calls_reader.feed(text)
                    if output.finished:
                        read = read + calls_reader.finish()
                    text, calls = read.content, read.calls
                for block in [
                    *items.reasoning(delta.reasoning),
                    *items.text(text),
                    *(event for call in calls for event in items.call(call)),
                ]:
                    yield block
                if output.finish_reason is not None and output.stats is not None:
                    finish_reason = output.finish_reason
                    stats = output.stats
    except ApiError as error:
        yield items.event("error", code=error.code, message=error.message, param=error.param)
        return
    # The engine ends every choice with a finish reason and statistics, or an error.
    assert stats is not None
    status = response_status(finish_reason)
    closing = items.close(status)
    if not any(isinstance(item, OutputMessage) for item in items.items) and not items.num_calls():
        closing += items.open_message() + items.close(status)
    for block in closing:
        yield block
    response = finish_response(
        target.draft,
        output=items.items,
        finish_reason=finish_reason,
        input_tokens=target.input_tokens,
        stats=stats,
        reasoning_tokens=reader.num_reasoning_tokens,
    )
    target.on_finish(response)
    final_type = f"response.{response.status}"
    yield items.event(final_type, response=response.model_dump(mode="json"))
