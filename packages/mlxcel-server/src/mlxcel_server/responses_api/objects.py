"""Response bodies of the Responses API, in the shapes of OpenAI's `Response` object."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from mlxcel_core.generate import GenerationStats

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


OutputItem = ReasoningItem | OutputMessage


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
    """A response; `usage` is set once it has finished.

    The tool fields hold their "no tools" values: mlxcel refuses `tools` on this endpoint.
    """

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
    parallel_tool_calls: bool = False
    tool_choice: Literal["none"] = "none"
    tools: list = []
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


def message_of(response: ResponseObject) -> OutputMessage:
    """The assistant message of a finished response (its last output item)."""
    message = response.output[-1]
    if not isinstance(message, OutputMessage):
        raise ValueError(f"the response {response.id} has no message item")
    return message


def finish_response(
    draft: ResponseObject,
    *,
    message_id: str,
    text: str,
    finish_reason: str,
    input_tokens: int,
    stats: GenerationStats,
    reasoning: ReasoningItem | None = None,
    reasoning_tokens: int = 0,
) -> ResponseObject:
    """`draft` finished with its one message: `incomplete` when the token limit ended it.

    Args:
        draft: the response as it started.
        message_id: the id of its output message.
        text: the whole generated text.
        finish_reason: the choice's OpenAI `finish_reason` (`stop` or `length`).
        input_tokens: prompt tokens.
        stats: the choice's statistics (tokens generated, prefix-cache hits).
        reasoning: the reasoning item before the message, or None when it had none.
        reasoning_tokens: of the generated tokens, those that were reasoning.
    """
    status: Status = "incomplete" if finish_reason == "length" else "completed"
    message = OutputMessage(id=message_id, status=status, content=[OutputTextPart(text=text)])
    return draft.model_copy(
        update={
            "status": status,
            "output": [message] if reasoning is None else [reasoning, message],
            "incomplete_details": (
                IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None
            ),
            "usage": make_response_usage(input_tokens, stats, reasoning_tokens),
        }
    )
