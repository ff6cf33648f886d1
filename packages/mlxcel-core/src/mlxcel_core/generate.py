"""Single-sequence generation: chunked prefill, pipelined decode, stop criteria.

Layered as mlx-lm's generator is: `generate_steps` yields sampled tokens (with their log
probabilities when asked), `generate_tokens` only their ids, and `stream_generate` turns them
into text chunks with stop handling and timings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import mlx.core as mx

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.cache import KVCache
from mlxcel_core.logprobs import PendingLogprobs, TokenLogprobs, make_logprobs
from mlxcel_core.sampling.constraint import TokenConstraint, apply_constraint
from mlxcel_core.stopping import StopStringMatcher, StopTokenBan, ban_tokens, ban_unless_alone

Sampler = Callable[[mx.array, mx.array], mx.array]
"""Maps logits (V,) float and the token history (T,) int32 to a token id, shape () int32."""


class LanguageModel(Protocol):
    """A causal language model over mlxcel KV caches."""

    def make_cache(self) -> list[KVCache]:
        """One empty KV cache per attention layer."""
        ...

    def __call__(
        self, tokens: mx.array, cache: Sequence[KVCache], *, last_only: bool = False
    ) -> mx.array:
        """Run the model on new tokens, extending `cache`.

        Args:
            tokens: (B, L) int32 token ids following what `cache` holds.
            cache: the per-layer caches from `make_cache`, updated in place.
            last_only: compute logits for the last position only.

        Returns:
            Logits (B, L, V), or (B, 1, V) with `last_only`.
        """
        ...


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


class ContextOverflowError(ValueError):
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
            raise ValueError(f"context_size must be >= 1, got {self.context_size}")
        if self.max_tokens < -1:
            raise ValueError(f"max_tokens must be -1 (no limit) or >= 0, got {self.max_tokens}")
        if self.prefill_step_size < 1:
            raise ValueError(f"prefill_step_size must be >= 1, got {self.prefill_step_size}")
        if self.num_top_logprobs is not None and self.num_top_logprobs < 0:
            raise ValueError(f"num_top_logprobs must be None or >= 0, got {self.num_top_logprobs}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_predict_seconds is not None and not self.max_predict_seconds > 0:
            raise ValueError(
                f"max_predict_seconds must be None or > 0, got {self.max_predict_seconds}"
            )

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


@dataclass(frozen=True)
class GenerationChunk:
    """One piece of streamed output.

    Attributes:
        text: newly final text (may be empty while a character or stop string is pending).
        token_id: the token that produced this chunk, or None for the final flush.
        finish_reason: set on the last chunk only.
        stats: set on the last chunk only.
        logprobs: `token_id`'s log probabilities when `GenerationConfig.num_top_logprobs`
            is set; None otherwise and on the final flush.
    """

    text: str
    token_id: int | None
    finish_reason: FinishReason | None = None
    stats: GenerationStats | None = None
    logprobs: TokenLogprobs | None = None


@dataclass(frozen=True)
class SampledToken:
    """One decode step's result.

    Attributes:
        token_id: the sampled token.
        logprobs: its log probabilities, when they were asked for.
    """

    token_id: int
    logprobs: TokenLogprobs | None = None


def prefill(
    model: LanguageModel,
    prompt: mx.array,
    cache: Sequence[KVCache],
    *,
    prefill_step_size: int,
) -> mx.array:
    """Run all prompt tokens through the model in chunks; return the last logits.

    Args:
        prompt: (L,) int32 prompt token ids, L >= 1.

    Returns:
        Logits of the last prompt position, shape (V,), not yet evaluated.
    """
    while prompt.shape[0] > prefill_step_size:
        model(prompt[None, :prefill_step_size], cache)
        mx.eval([state for layer in cache for state in layer.state])
        prompt = prompt[prefill_step_size:]
    return model(prompt[None], cache, last_only=True)[0, -1]


def generate_steps(
    model: LanguageModel,
    prompt: Sequence[int],
    sampler: Sampler,
    *,
    cache: Sequence[KVCache] | None = None,
    prefill_step_size: int = 2048,
    num_top_logprobs: int | None = None,
    constraint: TokenConstraint | None = None,
    stop_ban: StopTokenBan | None = None,
) -> Iterator[SampledToken]:
    """Yield sampled tokens without end; the caller decides when to stop.

    Decode is pipelined: step n+1 is queued with `mx.async_eval` before token n is read
    back, so the host never waits for the device between steps (as mlx-lm does). Log
    probabilities, when asked for, are queued in the same evaluation as their token.

    A `constraint` turns the pipelining off: its mask for step n+1 depends on token n, so
    each token is evaluated as soon as it is drawn, and the next one is drawn only after the
    caller has taken it (no token is drawn past the one generation stops at). Disallowed
    tokens get -inf before the sampler chain; log probabilities stay those of the raw logits.

    Args:
        num_top_logprobs: None for no log probabilities; k >= 0 for the sampled token's
            log probability and the k likeliest alternatives (see `make_logprobs`).
        constraint: the request's token constraint (structured output), or None.
        stop_ban: the stop tokens kept from being drawn, by the number drawn before (see
            `StopTokenBan`); a constraint that allows nothing else still gets them.

    Raises:
        ValueError: `prompt` is empty.
    """
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    cache = model.make_cache() if cache is None else cache
    history = mx.array(prompt, dtype=mx.int32)
    num_drawn = 0

    def sample(logits: mx.array) -> tuple[mx.array, PendingLogprobs | None]:
        nonlocal num_drawn
        banned = frozenset() if stop_ban is None else stop_ban.banned(num_drawn)
        num_drawn += 1
        allowed = logits
        if constraint is not None:
            mask = constraint.allowed_mask(logits.shape[-1])
            allowed = apply_constraint(logits, mask)
            banned = ban_unless_alone(mask, banned)
        token = sampler(ban_tokens(allowed[None], [banned])[0], history)
        pending = None
        if num_top_logprobs is None:
            mx.async_eval(token)
        else:
            pending = make_logprobs(logits, token, num_top_logprobs)
            mx.async_eval(token, *pending.arrays())
        if constraint is not None:
            constraint.advance(int(token.item()))
        return token, pending

    token, pending = sample(prefill(model, history, cache, prefill_step_size=prefill_step_size))
    while True:
        history = mx.concatenate([history, token.reshape(1)])
        logits = model(token.reshape(1, 1), cache, last_only=True)[0, -1]
        upcoming = sample(logits) if constraint is None else None
        token_id = int(token.item())
        yield SampledToken(token_id, None if pending is None else pending.read(token_id))
        token, pending = sample(logits) if upcoming is None else upcoming


def generate_tokens(
    model: LanguageModel,
    prompt: Sequence[int],
    sampler: Sampler,
    *,
    cache: Sequence[KVCache] | None = None,
    prefill_step_size: int = 2048,
) -> Iterator[int]:
    """Yield sampled token ids without end (`generate_steps` without log probabilities).

    Raises:
        ValueError: `prompt` is empty.
    """
    steps = generate_steps(model, prompt, sampler, cache=cache, prefill_step_size=prefill_step_size)
    for step in steps:
        yield step.token_id


class TextAssembler:
    """Applies one sequence's stop criteria to its sampled tokens and assembles its text.

    Generation ends with `FinishReason.STOP` on a stop token or stop string (a stop string
    only from `min_tokens` tokens on), and with `FinishReason.LENGTH` at `max_tokens`, when
    the context window is full, or past `max_predict_seconds` once the text holds a newline.
    Stop tokens and stop strings are never part of the text.

    Args:
        detokenizer: the sequence's own incremental detokenizer.
        config: its limits and stop criteria.
        num_prompt_tokens: its prompt length (tokens).
        clock: seconds from an arbitrary origin (`time.perf_counter`).

    Raises:
        ContextOverflowError: the prompt fills the whole context window.
    """

    def __init__(
        self,
        detokenizer: Detokenizer,
        config: GenerationConfig,
        num_prompt_tokens: int,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if num_prompt_tokens >= config.context_size:
            raise ContextOverflowError(
                f"the prompt has {num_prompt_tokens} tokens but the context size is "
                f"{config.context_size}; shorten the prompt or raise -c/--ctx-size"
            )
        budget = config.context_size - num_prompt_tokens
        if config.max_tokens >= 0:
            budget = min(budget, config.max_tokens)
        self.budget = budget
        self.num_generated = 0
        self.finish_reason: FinishReason | None = FinishReason.LENGTH if budget == 0 else None
        self._detokenizer = detokenizer
        self._stop_token_ids = config.stop_token_ids
        self._matcher = StopStringMatcher(config.stop_strings)
        self._min_tokens = config.min_tokens
        self._ban = config.stop_token_ban
        self._max_predict_seconds = config.max_predict_seconds
        self._clock = clock
        self._first_token_time = 0.0
        self._has_newline = False

    def banned_token_ids(self, ahead: int = 0) -> frozenset[int]:
        """The stop tokens the draw `ahead` tokens after the next one may not give (see
        `GenerationConfig.min_tokens` and `ignore_eos`)."""
        return self._ban.banned(self.num_generated + ahead)

    def add(self, token_id: int) -> str:
        """Take one sampled token; return the text it makes final.

        Sets `finish_reason` when this token ends the sequence.

        Raises:
            ValueError: the sequence has already finished.
        """
        if self.finish_reason is not None:
            raise ValueError("the sequence has already finished")
        self.num_generated += 1
        if self.num_generated == 1:
            self._first_token_time = self._clock()
        if token_id in self._stop_token_ids:
            self.finish_reason = FinishReason.STOP
            return ""
        text = self._detokenizer.add_token(token_id)
        self._has_newline = self._has_newline or "\n" in text
        match = self._matcher.feed(text, may_stop=self.num_generated >= self._min_tokens)
        if match.stopped:
            self.finish_reason = FinishReason.STOP
        elif self.num_generated == self.budget or self._out_of_time():
            self.finish_reason = FinishReason.LENGTH
        return match.text

    def _out_of_time(self) -> bool:
        limit = self._max_predict_seconds
        return (
            limit is not None
            and self._has_newline
            and self._clock() - self._first_token_time > limit
        )

    def finish(self) -> str:
        """The text still held back, once the sequence has ended (a stop string may still
        complete in it, which makes the finish reason `STOP`)."""
        may_stop = self.num_generated >= self._min_tokens
        rest = self._matcher.feed(self._detokenizer.finalize(), may_stop=may_stop)
        if rest.stopped:
            self.finish_reason = FinishReason.STOP
            return rest.text
        return rest.text + self._matcher.flush()


def stream_generate(
    model: LanguageModel,
    prompt: Sequence[int],
    sampler: Sampler,
    detokenizer: Detokenizer,
    config: GenerationConfig,
    *,
    constraint: TokenConstraint | None = None,
    adapters: RowAdapterScales | None = None,
) -> Iterator[GenerationChunk]:
    """Generate text for `prompt`, streaming chunks until a stop criterion (`TextAssembler`).

    A `constraint` limits every draw to the tokens it allows (see `generate_steps`); once
    it is complete it allows only stop tokens. The model's unfused LoRA `adapters`, if
    any, run at their global scales.

    Raises:
        ContextOverflowError: the prompt fills the whole context window.
    """
    text = TextAssembler(detokenizer, config, len(prompt))
    if adapters is not None:
        adapters.set_row_scales([adapters.resolve_scales(None)])
    mx.reset_peak_memory()
    start = time.perf_counter()
    first_token_time = start
    steps = generate_steps(
        model,
        prompt,
        sampler,
        prefill_step_size=config.prefill_step_size,
        num_top_logprobs=config.num_top_logprobs,
        constraint=constraint,
        stop_ban=config.stop_token_ban,
    )
    for step in steps if text.finish_reason is None else ():
        if text.num_generated == 0:
            first_token_time = time.perf_counter()
        piece = text.add(step.token_id)
        if step.token_id not in config.stop_token_ids:
            yield GenerationChunk(piece, step.token_id, logprobs=step.logprobs)
        if text.finish_reason is not None:
            break
    end = time.perf_counter()
    final_text = text.finish()
    stats = GenerationStats(
        prompt_tokens=len(prompt),
        prompt_seconds=first_token_time - start,
        generated_tokens=text.num_generated,
        decode_seconds=end - first_token_time,
        peak_memory_bytes=mx.get_peak_memory(),
    )
    yield GenerationChunk(final_text, None, text.finish_reason, stats)
