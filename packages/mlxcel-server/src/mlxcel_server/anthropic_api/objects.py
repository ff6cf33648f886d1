"""The message object `/v1/messages` answers, and its content blocks."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel

from mlxcel_core.request import GenerationStats
from mlxcel_server.anthropic_api.stop_reason import StopReason
from mlxcel_server.tools.reader import read_reply
from mlxcel_server.tools.use import ToolUse


class ThinkingContent(BaseModel):
    """A reply's reasoning. `signature` is always empty: thinking blocks sent back are left
    out of the prompt, so there is nothing for a signature to verify."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseContent(BaseModel):
    """A tool call; `input` is its arguments object."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class Usage(BaseModel):
    """Tokens of one message. As Anthropic counts them, `input_tokens` leaves out the prompt
    tokens read from the prefix cache, which `cache_read_input_tokens` counts."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0


class MessageObject(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ThinkingContent | TextContent | ToolUseContent]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage


def make_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def make_usage(prompt_tokens: int, stats: GenerationStats) -> Usage:
    """Usage of a reply to a prompt of `prompt_tokens` tokens."""
    return Usage(
        input_tokens=prompt_tokens - stats.cached_tokens,
        output_tokens=stats.generated_tokens,
        cache_read_input_tokens=stats.cached_tokens,
    )


def make_tool_use_id() -> str:
    """A fresh `tool_use` block id, as Anthropic writes them."""
    return f"toolu_{uuid.uuid4().hex[:24]}"


def make_content(
    text: str, tool_use: ToolUse | None, reasoning: str = ""
) -> list[ThinkingContent | TextContent | ToolUseContent]:
    """A whole reply's content blocks: its reasoning (if any), its text (if any), then its
    tool calls (if any), read from the text alone. A call whose input is not a whole JSON
    object (the token limit cut it) is left out."""
    reply_text: str | None = text
    blocks: list[ToolUseContent] = []
    if tool_use is not None:
        reply = read_reply(text, tool_use.tool_format, parallel=tool_use.parallel)
        reply_text = reply.content
        for call in reply.tool_calls:
            arguments = call.arguments_object()
            if arguments is not None:
                blocks.append(
                    ToolUseContent(id=make_tool_use_id(), name=call.name, input=arguments)
                )
    thoughts = [ThinkingContent(thinking=reasoning)] if reasoning else []
    texts = [TextContent(text=reply_text)] if reply_text else []
    return [*thoughts, *texts, *blocks]
