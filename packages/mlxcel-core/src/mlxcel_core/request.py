"""What one generation asks for and reports, shared by the single-sequence loop
(`generate.py`) and the engine: its limits and stop criteria, why it finished, its timings,
and the detokenizer that turns its tokens into text."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from mlxcel_core.errors import InputError, ParamError
from mlxcel_core.stopping import StopTokenBan


class Detokenizer(Protocol):
    """Turns a stream of token ids into text without splitting characters."""

    def add_token(self, token_id: int) -> str:
        """Add one token; return the text that became final."""
        ...

    def finalize(self) -> str:
        """Return whatever text is still held back."""
        ...


class FinishReason(StrEnum):
    """Why generation ended, with OpenAI's `finish_reason` values."""

    STOP = "stop"
    LENGTH = "length"


class ContextOverflowError(InputError, ValueError):
    """The prompt does not fit in the context window."""


@dataclass(frozen=True)
class GenerationConfig:
    """Limits and stop criteria of one generation.

    Attributes:
        context_size: the context window (tokens); prompt plus output never exceed it.
        max_tokens: most tokens to generate; -1 generates until the context is full.
        prefill_step_size: prompt tokens per forward pass during prefill.
        stop_token_ids: tokens that end generation (EOS, end of turn); never shown.
        stop_strings: strings that end generation; never shown.
        num_top_logprobs: None computes no log probabilities (no cost); k >= 0 reports each
            sampled token's log probability and the k likeliest alternatives.
        min_tokens: the stop tokens cannot be drawn, and stop strings do not stop, before
            this many tokens are generated (vLLM's `min_tokens`).
        ignore_eos: the stop tokens cannot be drawn at all (llama-server's and vLLM's
            `ignore_eos`); stop strings and the token limit still end generation.
        max_predict_seconds: once this long has passed since the first token and the text
            holds a newline, generation ends with `LENGTH` (llama-server's
            `t_max_predict_ms`); None for no limit.

    Raises:
        ParamError: on construction, a field is out of range; `param` names it.
    """

    context_size: int
    max_tokens: int = -1
    prefill_step_size: int = 2048
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    num_top_logprobs: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    max_predict_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.context_size < 1:
            raise ParamError("context_size", f"context_size must be >= 1, got {self.context_size}")
        if self.max_tokens < -1:
            raise ParamError(
                "max_tokens", f"max_tokens must be -1 (no limit) or >= 0, got {self.max_tokens}"
            )
        if self.prefill_step_size < 1:
            raise ParamError(
                "prefill_step_size",
                f"prefill_step_size must be >= 1, got {self.prefill_step_size}",
            )
        if self.num_top_logprobs is not None and self.num_top_logprobs < 0:
            raise ParamError(
                "num_top_logprobs",
                f"num_top_logprobs must be None or >= 0, got {self.num_top_logprobs}",
            )
        if self.min_tokens < 0:
            raise ParamError("min_tokens", f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_predict_seconds is not None and not self.max_predict_seconds > 0:
            raise ParamError(
                "max_predict_seconds",
                f"max_predict_seconds must be None or > 0, got {self.max_predict_seconds}",
            )

    def token_budget(self, num_prompt_tokens: int) -> int:
        """The most tokens a prompt of `num_prompt_tokens` may generate: `max_tokens`, cut
        to what the context window leaves.

        Raises:
            ContextOverflowError: the prompt fills the whole context window.
        """
        if num_prompt_tokens >= self.context_size:
            raise ContextOverflowError(
                f"the prompt has {num_prompt_tokens} tokens but the context size is "
                f"{self.context_size}; shorten the prompt or raise -c/--ctx-size"
            )
        budget = self.context_size - num_prompt_tokens
        return budget if self.max_tokens < 0 else min(budget, self.max_tokens)

    @property
    def stop_token_ban(self) -> StopTokenBan:
        """The stop tokens kept from being drawn, by `min_tokens` and `ignore_eos`."""
        return StopTokenBan(self.stop_token_ids, self.min_tokens, self.ignore_eos)


@dataclass(frozen=True)
class GenerationStats:
    """Timings of one generation.

    Attributes:
        prompt_tokens: tokens prefilled.
        prompt_seconds: prefill time, up to the first sampled token (the TTFT).
        generated_tokens: tokens sampled, the stop token included.
        decode_seconds: time from the first sampled token to the last.
        peak_memory_bytes: MLX's peak memory during the run.
        cached_tokens: prompt tokens whose KV came from the prefix cache, not computed.
        draft_tokens: draft tokens verified (speculative decoding).
        accepted_draft_tokens: of those, tokens accepted.
    """

    prompt_tokens: int
    prompt_seconds: float
    generated_tokens: int
    decode_seconds: float
    peak_memory_bytes: int
    cached_tokens: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens/s over the decode steps (the first token is counted in prefill)."""
        steps = self.generated_tokens - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds > 0 else 0.0
