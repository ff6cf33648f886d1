"""`POST /v1/messages` bodies as pydantic models, following Anthropic's schema.

As in `mlxcel_server.schemas`, types are strict and unknown fields are refused; a field
mlxcel does not implement (`service_tier`, server tools, ...) is not declared, so a request
that sends it gets a 400 naming it. `cache_control` is accepted wherever Anthropic
allows it: the prefix cache reuses a repeated prompt prefix without being asked.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mlxcel_server.schemas import FUNCTION_NAME


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Strict):
    """Text, never empty (as Anthropic's API requires); `citations` is accepted only empty,
    as replies carry none."""

    type: Literal["text"]
    text: Annotated[str, Field(min_length=1)]
    cache_control: CacheControl | None = None
    citations: None = None


class ImageBlock(_Strict):
    """An image in a user message: `source` is `{"type": "base64", "media_type", "data"}` or
    `{"type": "url", "url"}`, read under the server's media policy as chat images are."""

    type: Literal["image"]
    source: dict[str, Any]
    cache_control: CacheControl | None = None


class DirectCaller(_Strict):
    """Who made a tool call: the model itself (calls from server-side code execution are
    not supported)."""

    type: Literal["direct"]


class ToolUseBlock(_Strict):
    """A tool call an assistant made; `input` is the arguments object. `caller` is
    accepted as replies sent back carry it."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: DirectCaller | None = None


class ToolResultBlock(_Strict):
    """The result of the call `tool_use_id`; `is_error` marks a failed call."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] | str = ""
    is_error: bool = False
    cache_control: CacheControl | None = None


class ThinkingBlock(_Strict):
    """An earlier reply's reasoning, sent back as it came."""

    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(_Strict):
    """One turn: a non-empty string, or a non-empty list of content blocks."""

    role: Literal["user", "assistant"]
    # The list comes first so that a bad block, not "should be a string", is what 400s name.
    content: (
        Annotated[list[ContentBlock], Field(min_length=1)] | Annotated[str, Field(min_length=1)]
    )


class Tool(_Strict):
    """A client tool the model may call; `input_schema` is a JSON schema of its input."""

    type: Literal["custom"] | None = None
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None


class AutoToolChoice(_Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class AnyToolChoice(_Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class NamedToolChoice(_Strict):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool = False


class NoToolChoice(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[
    AutoToolChoice | AnyToolChoice | NamedToolChoice | NoToolChoice, Field(discriminator="type")
]


class EnabledThinking(_Strict):
    """Reasoning on, at most `budget_tokens` tokens of it per reply (Anthropic's minimum of
    1,024 is not imposed: small budgets suit small local models)."""

    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1)


class DisabledThinking(_Strict):
    """Reasoning off."""

    type: Literal["disabled"]


ThinkingConfig = Annotated[EnabledThinking | DisabledThinking, Field(discriminator="type")]


class Metadata(_Strict):
    """An opaque id of the end user, for the caller's own records."""

    user_id: str | None = None


class PromptFields(_Strict):
    """What renders the prompt: shared by `/v1/messages` and `/v1/messages/count_tokens`."""

    model: str
    messages: list[Message]
    system: Annotated[list[TextBlock], Field(min_length=1)] | str | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = None
    thinking: ThinkingConfig | None = None

    def system_text(self) -> str | None:
        """`system` as one string; text blocks are joined with newlines."""
        if self.system is None or isinstance(self.system, str):
            return self.system
        return "\n".join(block.text for block in self.system)


class MessagesRequest(PromptFields):
    """A request to create a message.

    `temperature` (0-1), `top_p` and `top_k` left out take the server's defaults.
    """

    max_tokens: int = Field(ge=1)
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    stream: bool = False


class CountTokensRequest(PromptFields):
    """A request to count a prompt's tokens."""
