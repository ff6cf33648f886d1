"""Request bodies as pydantic models: strict types, unknown fields refused.

A field mlxcel does not implement is not declared, so a request that sends it is refused
with a 400 naming it, never silently ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    """A message; content is a string or a list of text parts (joined with newlines).

    Only an assistant message may leave its content out; an empty string is content.
    """

    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart] | None = None

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.role != "assistant" and (self.content is None or self.content == []):
            raise ValueError(f"a {self.role} message needs content (a string or text parts)")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class GenerationFields(_Strict):
    """Fields shared by chat completions and completions.

    Sampling fields left out (None) take the server's defaults (its sampling flags).
    """

    model: str | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    top_n_sigma: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    seed: int | None = None
    logit_bias: dict[str, float | bool] | None = None


class ChatCompletionRequest(GenerationFields):
    """A chat completion; `top_logprobs` (0-20) needs `logprobs: true`."""

    messages: list[ChatMessage]
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(GenerationFields):
    """A completion; `logprobs` (0-5) counts the alternatives reported per token."""

    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None


class TokenizeRequest(_Strict):
    content: str
    add_special: bool = False


class DetokenizeRequest(_Strict):
    tokens: list[int]


class ApplyTemplateRequest(_Strict):
    messages: list[ChatMessage]
