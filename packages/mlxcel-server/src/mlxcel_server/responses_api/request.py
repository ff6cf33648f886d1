"""`POST /v1/responses` bodies as pydantic models: strict types, unknown fields refused.

As in `mlxcel_server.schemas`, a field mlxcel does not implement (`tools`, `reasoning`, ...)
is not declared, so a request that sends it gets a 400 naming it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    """Assistant text sent back as input, e.g. an earlier reply's `output` replayed."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] | None = None


class InputMessage(_Strict):
    """One message item; `developer` is rendered as a system message.

    `id` and `status` are accepted so that a reply's output items can be sent back as they are.
    """

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[InputText | OutputText]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        """The content as one string; text parts are joined with newlines."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class TextConfig(_Strict):
    """`text`: only the plain-text format; any other is refused by the handler, naming it."""

    format: dict[str, Any] | None = None


class ResponseRequest(_Strict):
    """A request to create a response.

    Sampling fields left out (None) take the server's defaults; `max_output_tokens` left out
    takes the server's `-n`.
    """

    model: str | None = None
    input: str | list[InputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    text: TextConfig | None = None
