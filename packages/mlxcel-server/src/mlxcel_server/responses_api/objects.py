"""Response bodies of the Responses API, in the shapes of OpenAI's `Response` object."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from mlxcel_core.request import GenerationStats
from mlxcel_server.tools.use import make_call_id

Status = Literal["in_progress", "completed", "incomplete"]


class OutputTextPart(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = []


class OutputMessage(BaseModel):
    """The assistant message item; its content is one text part (none while it starts)."""

    type: Literal["message"] = "message"
    id: str
    status: Status
    role: Literal["assistant"] = "assistant"
    content: list[OutputTextPart]


class ReasoningTextPart(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """The reasoning item that precedes the message: the model's reasoning as one
    `reasoning_text` part (none while it starts); mlxcel writes no summaries."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    status: Status
    summary: list = []
    content: list[ReasoningTextPart]


class FunctionCallItem(BaseModel):
    """A function call the reply makes; `arguments` is JSON text (partial while it streams,
    or when the token limit cut it)."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Status


OutputItem = ReasoningItem | OutputMessage | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseText(BaseModel):
    """`text`: the request's `text.format`, fields left out omitted (free text when none)."""

    format: dict[str, Any] = Field(default_factory=lambda: {"type": "text"})


class ResponseObject(BaseModel):
    """A response; `usage` is set once it has finished. The tool fields echo the request's."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    model: str
    output: list[OutputItem]
    incomplete_details: IncompleteDetails | None = None
    error: None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    store: bool
    parallel_tool_calls: bool = True
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = []
    text: ResponseText = ResponseText()
    usage: ResponseUsage | None = None


def make_response_usage(
    input_tokens: int, stats: GenerationStats, reasoning_tokens: int = 0
) -> ResponseUsage:
    """Usage of a one-message response with its choice's statistics; `reasoning_tokens`
    of its output tokens were reasoning."""
    output_tokens = stats.generated_tokens
    return ResponseUsage(
        input_tokens=input_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=stats.cached_tokens),
        output_tokens=output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
        total_tokens=input_tokens + output_tokens,
    )


def make_output(
    text: str,
    calls: Sequence[tuple[str, str]],
    *,
    status: Status,
    reasoning: ReasoningItem | None = None,
) -> list[OutputItem]:
    """A finished reply's output items: its reasoning (if any), its message (when it has
    text, or makes no call), then its function calls. Each is `completed` but the last,
    which takes `status` (`incomplete` when the token limit cut it).

    Args:
        text: the reply's text outside tool markup.
        calls: each call's name and arguments (JSON text).
        status: the reply's status.
        reasoning: the reasoning item, or None.
    """
    items: list[OutputItem] = [] if reasoning is None else [reasoning]
    if text or not calls:
        part = OutputTextPart(text=text)
        items.append(OutputMessage(id=make_item_id("msg"), status="completed", content=[part]))
    items += [
        FunctionCallItem(
            id=make_item_id("fc"),
            call_id=make_call_id(),
            name=name,
            arguments=arguments,
            status="completed",
        )
        for name, arguments in calls
    ]
    if not isinstance(items[-1], ReasoningItem):
        items[-1] = items[-1].model_copy(update={"status": status})
    return items


def make_item_id(prefix: str) -> str:
    """A fresh output item id (`msg`, `rs`, `fc`), as OpenAI writes them."""
    return f"{prefix}_{uuid.uuid4().hex}"


def response_status(finish_reason: str) -> Status:
    """`incomplete` when the token limit ended the reply, else `completed`."""
    return "incomplete" if finish_reason == "length" else "completed"


def finish_response(
    draft: ResponseObject,
    *,
    output: list[OutputItem],
    finish_reason: str,
    input_tokens: int,
    stats: GenerationStats,
    reasoning_tokens: int = 0,
) -> ResponseObject:
    """`draft` finished with its output items: `incomplete` when the token limit ended it.

    Args:
        draft: the response as it started.
        output: its output items (see `make_output`).
        finish_reason: the choice's OpenAI `finish_reason` (`stop` or `length`).
        input_tokens: prompt tokens.
        stats: the choice's statistics (tokens generated, prefix-cache hits).
        reasoning_tokens: of the generated tokens, those that were reasoning.
    """
    status = response_status(finish_reason)
    return draft.model_copy(
        update={
            "status": status,
            "output": output,
            "incomplete_details": (
                IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None
            ),
            "usage": make_response_usage(input_tokens, stats, reasoning_tokens),
        }
    )
