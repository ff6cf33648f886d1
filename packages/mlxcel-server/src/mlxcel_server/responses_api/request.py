"""`POST /v1/responses` bodies as pydantic models: strict types, unknown fields refused.

As in `mlxcel_server.schemas`, a field mlxcel does not implement (`reasoning`, built-in
tools, ...) is not declared, so a request that sends it gets a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from mlxcel_server.schemas import FUNCTION_NAME, JsonSchemaFormat, ResponseFormat
from mlxcel_server.service_fields import ResponsesServiceFields


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class InputImage(_Strict):
    """An image in a user message: `image_url` is a data URL, an `http(s)` URL (when the
    server fetches) or a local path under the server's allowed directory. `detail` is
    accepted; the model's own image processor sets the resolution."""

    type: Literal["input_image"]
    image_url: str
    detail: Literal["auto", "low", "high"] = "auto"


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
    content: str | list[Annotated[InputText | OutputText | InputImage, Field(discriminator="type")]]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @model_validator(mode="after")
    def _images_only_from_the_user(self) -> InputMessage:
        if self.role != "user" and self.image_urls():
            raise ValueError(
                f"only user messages may hold input_image items, not {self.role} messages"
            )
        return self

    def text(self) -> str:
        """The content as one string; text parts are joined with newlines."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content if not isinstance(part, InputImage))

    def image_urls(self) -> list[str]:
        """The message's images, in order."""
        if isinstance(self.content, str):
            return []
        return [part.image_url for part in self.content if isinstance(part, InputImage)]


class ReasoningInput(_Strict):
    """A reasoning item of an earlier reply, sent back with its output as OpenAI's clients
    do; it is accepted and not rendered (reasoning templates drop earlier turns' reasoning)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = []
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


_ItemStatus = Literal["in_progress", "completed", "incomplete"]


class FunctionCallInput(_Strict):
    """A function call of an earlier reply, sent back as it came (`arguments` is JSON text)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: _ItemStatus | None = None


class FunctionCallOutputInput(_Strict):
    """The result of the call `call_id`: text, or a list of text parts."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: _ItemStatus | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "\n".join(part.text for part in self.output)


_ITEM_KINDS = frozenset({"reasoning", "function_call", "function_call_output"})


def _input_item_kind(item: Any) -> str:
    kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    return kind if kind in _ITEM_KINDS else "message"


# Picked by `type` (a message may leave it out), so that a message's own error is the one
# reported rather than every union member's.
InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[ReasoningInput, Tag("reasoning")]
    | Annotated[FunctionCallInput, Tag("function_call")]
    | Annotated[FunctionCallOutputInput, Tag("function_call_output")],
    Discriminator(_input_item_kind),
]


class FunctionTool(_Strict):
    """A function the model may call; `parameters` is a JSON schema of its arguments.
    `strict` is accepted and the schema is always enforced."""

    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(_Strict):
    """A choice that forces a call of the function `name`."""

    type: Literal["function"]
    name: str


class TextFormat(_Strict):
    """`text.format`: free text, any JSON object, or JSON following a schema.

    Unlike chat's `response_format`, the Responses API puts a schema's `name`, `schema`,
    `description` and `strict` in the format itself; `strict` is accepted and the schema is
    always enforced.
    """

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, pattern=FUNCTION_NAME)
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_fits_the_type(self) -> TextFormat:
        has_schema = self.name is not None or self.json_schema is not None
        if self.type == "json_schema" and (self.name is None or self.json_schema is None):
            raise ValueError("type 'json_schema' needs `name` and `schema`")
        if self.type != "json_schema" and (has_schema or self.description or self.strict):
            raise ValueError(f"type {self.type!r} takes no schema fields")
        return self

    def response_format(self) -> ResponseFormat:
        """The same format as chat's `response_format`, for the shared constraint builder."""
        if self.type != "json_schema":
            return ResponseFormat(type=self.type)
        schema = JsonSchemaFormat.model_validate(
            self.model_dump(by_alias=True, exclude={"type"}, exclude_none=True)
        )
        return ResponseFormat(type="json_schema", json_schema=schema)


class TextConfig(_Strict):
    """`text`: the reply's format; left out, free text."""

    format: TextFormat | None = None


class ResponseRequest(_Strict, ResponsesServiceFields):
    """A request to create a response.

    Sampling fields left out (None) take the server's defaults; `max_output_tokens` left out
    takes the server's `-n`. `tool_choice` defaults to "auto" with tools;
    `parallel_tool_calls` left out is decided as for chat completions; `include` takes
    no entries (mlxcel adds no optional output), an empty list is accepted as clients send
    it. OpenAI's fields about its hosted service (`user`, `metadata`, `truncation:
    "disabled"`, ...) are taken without effect: `ResponsesServiceFields`.
    """

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool | None = None
    include: Annotated[list[str], Field(max_length=0)] | None = None
