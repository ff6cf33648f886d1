"""Response bodies as pydantic models: OpenAI's shapes plus llama-server's `timings`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, RootModel, SerializerFunctionWrapHandler, model_serializer

from mlxcel_core.request import GenerationStats
from mlxcel_server.logprobs import ChatLogprobs, CompletionLogprobs


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()
    completion_tokens_details: CompletionTokensDetails = CompletionTokensDetails()


class _OmitsNoReasoning(BaseModel):
    """Leaves `reasoning_content` out when there is none, as llama-server does."""

    @model_serializer(mode="wrap")
    def _omit_no_reasoning(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if data.get("reasoning_content") is None:
            data.pop("reasoning_content", None)
        return data


class Timings(BaseModel):
    """llama-server's timings: prompt (prefill) and predicted (decode) counts, ms and rates,
    and the draft tokens verified and accepted with speculative decoding."""

    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    draft_n: int = 0
    draft_n_accepted: int = 0


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(_OmitsNoReasoning):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: ChatLogprobs | None = None


class _CompletionObject(BaseModel):
    """The fields OpenAI's completion objects share, in their order; each kind names its
    `object` and the type of its choices. A streamed chunk leaves `usage` and `timings`
    unset until the end."""

    id: str
    object: str
    created: int
    model: str
    choices: list
    usage: Usage | None = None
    timings: Timings | None = None


class ChatCompletion(_CompletionObject):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings


class _OmitsNone(BaseModel):
    """Leaves out the fields that are None, as OpenAI's streamed tool calls do."""

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> dict:
        return {key: value for key, value in handler(self).items() if value is not None}


class FunctionCallDelta(_OmitsNone):
    """A piece of a streamed call: its name on the first piece, then arguments text."""

    name: str | None = None
    arguments: str = ""


class ToolCallDelta(_OmitsNone):
    """A piece of a streamed tool call: `index` orders the calls of one choice; the first
    piece of a call carries its `id`, `type` and name, the later ones arguments only."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatDelta(_OmitsNoReasoning):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(_CompletionObject):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class Completion(_CompletionObject):
    """A completion, or (with `usage` unset until the end) one streamed chunk of one."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


def make_usage(
    prompt_tokens: int,
    stats: Sequence[GenerationStats],
    num_choices: int,
    *,
    reasoning_tokens: int = 0,
) -> Usage:
    """Usage of one request: its prompts once, and the tokens every choice generated.

    Args:
        prompt_tokens: the prompts' tokens, each prompt counted once.
        stats: every choice's statistics, in choice order (prompt i's j-th choice at
            `i * num_choices + j`).
        num_choices: choices per prompt (`n`).
        reasoning_tokens: of the generated tokens, those inside reasoning spans.

    `cached_tokens` counts, like `prompt_tokens`, each prompt once: its first choice's
    prefix-cache hit (later choices of the same prompt hit the blocks the first computed).
    """
    completion_tokens = sum(s.generated_tokens for s in stats)
    cached_tokens = sum(s.cached_tokens for s in stats[::num_choices])
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning_tokens),
    )


def make_timings(stats: Sequence[GenerationStats]) -> Timings:
    """Timings summed over the choices of one request."""
    prompt_n = sum(s.prompt_tokens for s in stats)
    prompt_ms = 1000 * sum(s.prompt_seconds for s in stats)
    # The first sampled token is timed with the prompt, as in GenerationStats.
    predicted_n = sum(max(s.generated_tokens - 1, 0) for s in stats)
    predicted_ms = 1000 * sum(s.decode_seconds for s in stats)
    return Timings(
        prompt_n=prompt_n,
        prompt_ms=prompt_ms,
        prompt_per_token_ms=prompt_ms / prompt_n if prompt_n else 0.0,
        prompt_per_second=1000 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        predicted_n=predicted_n,
        predicted_ms=predicted_ms,
        predicted_per_token_ms=predicted_ms / predicted_n if predicted_n else 0.0,
        predicted_per_second=1000 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0,
        draft_n=sum(s.draft_tokens for s in stats),
        draft_n_accepted=sum(s.accepted_draft_tokens for s in stats),
    )


class LoraAdapterEntry(BaseModel):
    """One loaded LoRA adapter, as llama-server's `GET /lora-adapters` lists it."""

    id: int
    path: str
    scale: float


class LoraAdapterList(RootModel[list[LoraAdapterEntry]]):
    """`GET /lora-adapters`' body."""
