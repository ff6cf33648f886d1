"""Single-sequence generation: chunked prefill, pipelined decode, stop criteria.

Layered as mlx-lm's generator is: `generate_steps` yields sampled tokens (with their log
probabilities when asked), `generate_tokens` only their ids, and `stream_generate` turns them
into text chunks with stop handling and timings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.cache import KVCache
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.logprobs import PendingLogprobs, TokenLogprobs, make_logprobs
from mlxcel_core.request import Detokenizer, FinishReason, GenerationConfig, GenerationStats
from mlxcel_core.sampling.constraint import TokenConstraint, apply_constraint
from mlxcel_core.stopping import StopTokenBan, ban_tokens, ban_unless_alone
from mlxcel_core.text_assembler import TextAssembler

Sampler = Callable[[mx.array, mx.array], mx.array]
"""Maps logits (V,) float and the token history (T,) int32 to a token id, shape () int32."""


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
