"""Request bodies as pydantic models: strict types, unknown fields refused.

A field mlxcel does not implement is not declared, so a request that sends it is refused
with a 400 naming it, never silently ignored.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, model_validator

from mlxcel_server.service_fields import ChatServiceFields, EndUserFields

# OpenAI's rule for function and schema names.
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageUrl(_Strict):
    """Where an image is: a base64 `data:` URL, an `http(s)` URL (when the server fetches)
    or a local path or `file://` URL (under the server's allowed directory).

    `detail` is accepted as OpenAI's clients send it; every image is processed at the
    resolution the model's own image processor sets.
    """

    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImageUrlPart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | ImageUrlPart, Field(discriminator="type")]


class FunctionCall(_Strict):
    """A function an assistant called; `arguments` is JSON text."""

    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"]
    function: FunctionCall

    def template_dict(self) -> dict[str, Any]:
        """The call as chat templates read it: arguments as an object where they parse as one
        (templates such as Qwen's write them with `tojson`)."""
        try:
            arguments = json.loads(self.function.arguments)
        except (ValueError, RecursionError):
            arguments = self.function.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.function.name, "arguments": arguments},
        }


class ChatMessage(_Strict):
    """A message; content is a string or a list of parts: text parts (joined with newlines
    when the message holds no image) and, in user messages, `image_url` parts.

    `developer` is OpenAI's newer name for `system`. Only an assistant message may leave its
    content out (it then usually carries `tool_calls`); an empty string is content. A `tool`
    message answers the call named by its `tool_call_id`. An assistant message may carry
    the `reasoning_content` of a reply sent back; templates that render it (Qwen3) see it.
    """

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _fields_fit_the_role(self) -> ChatMessage:
        if self.role != "assistant" and (self.content is None or self.content == []):
            raise ValueError(f"a {self.role} message needs content (a string or text parts)")
        if self.image_urls() and self.role != "user":
            raise ValueError(
                f"only user messages may hold image_url parts, not {self.role} messages"
            )
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs content or tool_calls")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant message may carry tool_calls")
        if self.reasoning_content is not None and self.role != "assistant":
            raise ValueError("only an assistant message may carry reasoning_content")
        if (self.tool_call_id is not None) != (self.role == "tool"):
            raise ValueError("a tool message needs tool_call_id, and only a tool message has one")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content if isinstance(part, TextPart))

    def image_urls(self) -> list[ImageUrl]:
        """The message's images, in order."""
        if not isinstance(self.content, list):
            return []
        return [part.image_url for part in self.content if isinstance(part, ImageUrlPart)]

    def _template_content(self) -> str | list[dict[str, Any]]:
        if not isinstance(self.content, list) or not self.image_urls():
            return self.text()
        # Vision models' chat templates write their image marker for an `image` part.
        return [
            {"type": "text", "text": part.text} if isinstance(part, TextPart) else {"type": "image"}
            for part in self.content
        ]

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it (`developer` rendered as `system`); a
        message with images keeps its parts, each image as `{"type": "image"}`."""
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self._template_content(),
        }
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls is not None:
            message["tool_calls"] = [call.template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        return message


class FunctionDefinition(_Strict):
    """A function the model may call; `parameters` is a JSON schema of its arguments.
    `strict` is accepted and the schema is always enforced."""

    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition

    def template_dict(self) -> dict[str, Any]:
        """The definition as chat templates read it, fields left out staying out."""
        function: dict[str, Any] = {"name": self.function.name}
        if self.function.description is not None:
            function["description"] = self.function.description
        if self.function.parameters is not None:
            function["parameters"] = self.function.parameters
        return {"type": "function", "function": function}


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    """A named JSON schema the reply must follow; `strict` is accepted and the schema is
    always enforced."""

    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's `response_format`: free text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_fits_the_type(self) -> ResponseFormat:
        if (self.json_schema is not None) != (self.type == "json_schema"):
            raise ValueError("json_schema is needed with type 'json_schema', and only there")
        return self


class LoraScale(_Strict):
    """One LoRA adapter's scale, llama-server's `{"id": 0, "scale": 0.5}`."""

    id: int
    scale: float


class LoraScales(RootModel[list[LoraScale]]):
    """`POST /lora-adapters`' body: the new global scales; adapters not listed get 0."""


class GenerationFields(_Strict):
    """Fields shared by chat completions and completions.

    Sampling fields left out (None) take the server's defaults (its sampling flags).
    `lora` sets this request's adapter scales as llama-server does: adapters not listed get
    0; left out, the server's current scales apply.

    llama-server's and vLLM's own fields: `cache_prompt: false` computes the whole prompt
    without the prefix cache; `ignore_eos` never draws an end-of-sequence token;
    `min_tokens` draws none, and lets no stop string stop, before that many tokens;
    `n_probs` asks for that many alternatives per token when the API's own logprobs fields
    are left out; `samplers` orders the sampler chain (names, or one letter per stage);
    `t_max_predict_ms` ends generation with "length" once that long has passed since the
    first token and a newline was generated (0: no limit). `id_slot` is accepted and has no
    effect: the scheduler assigns slots, and all slots share one prefix cache.
    `n_predict` is llama-server's name for the token limit (-1: until the context is full),
    taken before `max_completion_tokens` and `max_tokens`; `grammar` (GBNF, or llguidance's
    Lark) and `json_schema` constrain the reply as llama-server's fields do (one of them, and
    not with `response_format`).

    `model` may name anything: the server's one model answers, as llama-server's does.
    """

    model: str | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n_predict: int | None = None
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
    response_format: ResponseFormat | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    lora: list[LoraScale] | None = None
    cache_prompt: bool = True
    ignore_eos: bool = False
    min_tokens: int | None = None
    n_probs: int | None = None
    samplers: list[str] | str | None = None
    t_max_predict_ms: int | float | None = None
    id_slot: int | None = None


class ChatCompletionRequest(GenerationFields, ChatServiceFields):
    """A chat completion; `top_logprobs` (0-20) needs `logprobs: true`.

    `tool_choice` defaults to "auto" with tools and "none" without. `parallel_tool_calls`
    lets a reply make several calls; left out, it does where the model's convention has
    several calls in one reply (Hermes, Mistral) and not otherwise (Llama 3, generic), as
    small models asked for a list of calls tend to repeat a call until the token limit.
    `reasoning_format` overrides the server's `--reasoning-format` for this request, and
    `chat_template_kwargs` passes extra variables to the chat template (`enable_thinking`),
    as llama-server accepts them. OpenAI's fields about its hosted service (`user`,
    `metadata`, `store: false`, ...) are taken without effect: `ChatServiceFields`.
    """

    messages: list[ChatMessage]
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_format: Literal["none", "deepseek", "deepseek-legacy", "auto"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(GenerationFields, EndUserFields):
    """A completion; `logprobs` (0-5) counts the alternatives reported per token.

    `prompt` is one prompt (text, or token ids used as they are) or a list of them. `user`
    is taken without effect: `EndUserFields`.
    """

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None


class TokenizeRequest(_Strict):
    """llama-server's `/tokenize`: `with_pieces` returns each token with its text."""

    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(_Strict):
    tokens: list[int]


class ApplyTemplateRequest(_Strict):
    messages: list[ChatMessage]
