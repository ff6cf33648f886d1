"""The `/v1/messages` event stream: named SSE events in Anthropic's order.

`message_start`, `ping`, then each content block as `content_block_start`, its
`content_block_delta`s and `content_block_stop`; then `message_delta` (stop reason, stop
sequence and the final usage) and `message_stop`. The blocks, in order: a reasoning model's
thinking (`thinking_delta`s, then an empty `signature_delta` just before its stop, as
Anthropic sends the signature), the text (`text_delta`s), and the tool calls (each call's
input as `input_json_delta`s, in the pieces it is generated in). A failure while generating
ends the stream with an `error` event.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from mlxcel_core.engine import EngineOutput
from mlxcel_core.request import FinishReason, GenerationStats
from mlxcel_server.anthropic_api.errors import anthropic_error_body
from mlxcel_server.anthropic_api.objects import (
    MessageObject,
    TextContent,
    ThinkingContent,
    ToolUseContent,
    Usage,
    make_tool_use_id,
    make_usage,
)
from mlxcel_server.anthropic_api.stop_reason import EndingTracker
from mlxcel_server.errors import ApiError
from mlxcel_server.reasoning import ReasoningPlan, ReplyReader
from mlxcel_server.sse import encode_named_event
from mlxcel_server.tools.reader import CallDelta, ToolCallReader
from mlxcel_server.tools.use import ToolUse


@dataclass(frozen=True)
class StreamTarget:
    """What the stream reports besides the generated text.

    Attributes:
        message_id: the message's id.
        model_id: the model name it carries.
        prompt_tokens: prompt tokens.
        tool_use: how the reply is read for tool calls; None for plain text.
        tracker: follows the reply's tokens to tell its stop reason.
        reasoning: how the reply is read for reasoning; None for plain text.
    """

    message_id: str
    model_id: str
    prompt_tokens: int
    tool_use: ToolUse | None
    tracker: EndingTracker
    reasoning: ReasoningPlan | None = None


def _message_start(target: StreamTarget) -> bytes:
    message = MessageObject(
        id=target.message_id,
        model=target.model_id,
        content=[],
        usage=Usage(input_tokens=target.prompt_tokens, output_tokens=0),
    )
    return encode_named_event("message_start", {"message": message.model_dump(mode="json")})


def _block_start(index: int, block: dict) -> bytes:
    return encode_named_event("content_block_start", {"index": index, "content_block": block})


def _delta(index: int, delta: dict) -> bytes:
    return encode_named_event("content_block_delta", {"index": index, "delta": delta})


_EMPTY_BLOCKS = {
    "thinking": ThinkingContent(thinking="").model_dump(),
    "text": TextContent(text="").model_dump(),
}


class _StreamedBlocks:
    """The content blocks as their pieces arrive: each opened with its first piece, closed
    when the next block starts or the reply ends.

    Attributes:
        count: the blocks opened so far (the next block's index).
        num_tool_uses: the tool_use blocks opened so far.
    """

    def __init__(self) -> None:
        self.count = 0
        self.num_tool_uses = 0
        self._open: str | None = None

    def add_call(self, delta: CallDelta) -> list[bytes]:
        """Events for a piece of a tool call: a new block with its first piece, then its
        input's JSON text as `input_json_delta`s."""
        events = []
        if delta.name is not None:
            events += self.close()
            self._open = "tool_use"
            self.count += 1
            self.num_tool_uses += 1
            block = ToolUseContent(id=make_tool_use_id(), name=delta.name, input={})
            events.append(_block_start(self.count - 1, block.model_dump(mode="json")))
        if delta.arguments:
            piece = {"type": "input_json_delta", "partial_json": delta.arguments}
            events.append(_delta(self.count - 1, piece))
        return events

    def add(self, kind: Literal["thinking", "text"], piece: str) -> list[bytes]:
        """Events for a piece of `kind`; none for an empty piece."""
        if not piece:
            return []
        events = []
        if kind != self._open:
            events += self.close()
            self._open = kind
            self.count += 1
            events.append(_block_start(self.count - 1, _EMPTY_BLOCKS[kind]))
        events.append(_delta(self.count - 1, {"type": f"{kind}_delta", kind: piece}))
        return events

    def close(self) -> list[bytes]:
        """Events closing the open block, if any."""
        if self._open is None:
            return []
        index = self.count - 1
        events = []
        if self._open == "thinking":
            events.append(_delta(index, {"type": "signature_delta", "signature": ""}))
        self._open = None
        return [*events, encode_named_event("content_block_stop", {"index": index})]


def _message_delta(
    target: StreamTarget, finish_reason: FinishReason, stats: GenerationStats, calls_tools: bool
) -> bytes:
    ending = target.tracker.ending(finish_reason, calls_tools=calls_tools)
    usage = make_usage(target.prompt_tokens, stats)
    delta = {"stop_reason": ending.stop_reason, "stop_sequence": ending.stop_sequence}
    return encode_named_event("message_delta", {"delta": delta, "usage": usage.model_dump()})


async def message_events(
    target: StreamTarget, outputs: AsyncIterator[EngineOutput]
) -> AsyncIterator[bytes]:
    """Encoded events for one message whose reply arrives as `outputs`.

    The opening events are sent with the first output, once prefill is done.
    """
    tool_use = target.tool_use
    calls_reader = (
        None
        if tool_use is None
        else ToolCallReader(tool_use.tool_format, parallel=tool_use.parallel)
    )
    reader = ReplyReader(target.reasoning)
    blocks = _StreamedBlocks()
    started = False
    finish_reason, stats = FinishReason.STOP, None
    try:
        # Closed on exit so that the engine request is cancelled at once when the client goes.
        async with contextlib.aclosing(outputs):
            async for output in outputs:
                # The opening events wait for the first output: the engine request is
                # cancelled in the iterator's `finally`, which an iterator never started
                # would not reach.
                if not started:
                    started = True
                    yield _message_start(target)
                    yield encode_named_event("ping", {})
                target.tracker.add(output)
                piece = reader.read(output)
                for event in blocks.add("thinking", piece.reasoning):
                    yield event
                text, calls = piece.content, ()
                if calls_reader is not None:
                    read = calls_reader.feed(text)
                    if output.finished:
                        read = read + calls_reader.finish()
                    text, calls = read.content, read.calls
                for event in blocks.add("text", text):
                    yield event
                for call in calls:
                    for event in blocks.add_call(call):
                        yield event
                if output.finish_reason is not None and output.stats is not None:
                    finish_reason, stats = output.finish_reason, output.stats
    except ApiError as error:
        yield encode_named_event("error", {"error": anthropic_error_body(error)["error"]})
        return
    # The engine ends every reply with a finish reason and statistics, or an error.
    assert stats is not None
    for event in blocks.close():
        yield event
    yield _message_delta(target, finish_reason, stats, calls_tools=blocks.num_tool_uses > 0)
    yield encode_named_event("message_stop", {})
