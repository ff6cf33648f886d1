"""History-dependent stages of the sampler chain: logit bias, repetition penalties and DRY.

Each stage takes logits of shape (..., V) float32 and returns logits of the same shape; they
mirror llama.cpp `src/llama-sampling.cpp` (`llama_sampler_logit_bias`,
`llama_sampler_penalties`, `llama_sampler_dry`).
"""

import math
from collections.abc import Mapping

import mlx.core as mx
import numpy as np

# Natural log of the largest float32, as llama.cpp uses to clamp DRY's exponent.
_FLOAT32_MAX_LOG = 88.7228391


def apply_logit_bias(logits: mx.array, logit_bias: Mapping[int, float]) -> mx.array:
    """Add a per-token bias to the logits.

    Source: llama.cpp `llama_sampler_logit_bias`; the OpenAI `logit_bias` request field.

    Args:
        logits: (..., V) float32.
        logit_bias: Token id -> value added to that token's logit; -inf bans the token.

    Returns:
        (..., V) float32 logits.

    Raises:
        ValueError: A token id is outside [0, V).
    """
    if not logit_bias:
        return logits
    vocab_size = logits.shape[-1]
    for token in logit_bias:
        if not 0 <= token < vocab_size:
            raise ValueError(f"logit_bias token id must be in [0, {vocab_size}), got {token}")
    tokens = mx.array(list(logit_bias), dtype=mx.int32)
    values = mx.array(list(logit_bias.values()), dtype=mx.float32)
    return logits + mx.zeros((vocab_size,), dtype=mx.float32).at[tokens].add(values)


def apply_penalties(
    logits: mx.array,
    history: mx.array,
    *,
    repeat_penalty: float,
    repeat_last_n: int,
    presence_penalty: float,
    frequency_penalty: float,
) -> mx.array:
    """Penalise tokens that occur in the last `repeat_last_n` tokens of the history.

    For a token seen c > 0 times in the window, its logit l becomes
    `(l / repeat_penalty if l > 0 else l * repeat_penalty) - c * frequency_penalty
    - presence_penalty`. The repetition penalty is CTRL's (Keskar et al. 2019,
    arXiv:1909.05858) with llama.cpp's sign fix (multiply non-positive logits, so a penalty
    never raises a token); presence and frequency penalties are as OpenAI defines them.
    Source: llama.cpp `llama_sampler_penalties_apply`.

    Args:
        logits: (..., V) float32.
        history: (T,) int32 token ids, prompt and generated; may be lazy.
        repeat_penalty: Factor > 0; 1.0 leaves logits unscaled.
        repeat_last_n: Window in tokens; 0 disables the stage, -1 uses the whole history.
        presence_penalty: Subtracted once from every token present in the window.
        frequency_penalty: Subtracted once per occurrence in the window.

    Returns:
        (..., V) float32 logits.
    """
    inactive = repeat_penalty == 1.0 and presence_penalty == 0.0 and frequency_penalty == 0.0
    if repeat_last_n == 0 or inactive or history.size == 0:
        return logits
    window = history if not 0 < repeat_last_n < history.size else history[-repeat_last_n:]
    counts = mx.zeros((logits.shape[-1],), dtype=mx.float32).at[window].add(1.0)
    scaled = mx.where(logits > 0, logits / repeat_penalty, logits * repeat_penalty)
    penalised = scaled - counts * frequency_penalty - presence_penalty
    return mx.where(counts > 0, penalised, logits)


def _reversed_z_function(tokens: np.ndarray) -> list[int]:
    """Z-function of the reversed sequence (Gusfield 1997, "Algorithms on Strings", 1.3).

    Entry k is the length of the longest common suffix of `tokens` and `tokens[:T - k]`, that
    is, how far the sequence's tail is repeated ending k tokens earlier. O(T).
    """
    reversed_tokens = tokens[::-1].tolist()
    size = len(reversed_tokens)
    z = [0] * size
    left = right = 0
    for k in range(1, size):
        if k < right:
            z[k] = min(right - k, z[k - left])
        while k + z[k] < size and reversed_tokens[z[k]] == reversed_tokens[k + z[k]]:
            z[k] += 1
        if k + z[k] > right:
            left, right = k, k + z[k]
    return z


def _dry_repeat_lengths(
    window: np.ndarray, allowed_length: int, breaker_ids: frozenset[int]
) -> dict[int, int]:
    """Map each token that would extend a repeat of the window's tail to that repeat's length.

    Matches are capped at the distance from the end to the last breaker, so no match crosses
    one. Breakers themselves are never penalised.
    """
    size = len(window)
    rep_limit = size
    for distance, token in enumerate(window[::-1].tolist()):
        if token in breaker_ids:
            rep_limit = distance
            break
    if rep_limit < allowed_length:
        return {}
    z = _reversed_z_function(window)
    lengths: dict[int, int] = {}
    for position in range(size - 1):
        length = min(z[size - 1 - position], rep_limit)
        following = int(window[position + 1])
        if length >= allowed_length and following not in breaker_ids:
            lengths[following] = max(length, lengths.get(following, 0))
    return lengths


def apply_dry(
    logits: mx.array,
    history: mx.array | np.ndarray,
    *,
    multiplier: float,
    base: float,
    allowed_length: int,
    penalty_last_n: int,
    breaker_ids: frozenset[int],
) -> mx.array:
    """DRY ("Don't Repeat Yourself"): penalise the tokens that would extend a repetition.

    If the last n tokens of the history also occur earlier, followed by token t, then t's logit
    is lowered by `multiplier * base ** (n - allowed_length)` for the longest such n >=
    `allowed_length` (the exponent is clamped so the penalty stays a finite float32). A
    sequence breaker in the history ends the tail that can match, and breakers are never
    penalised. Source: p-e-w, text-generation-webui PR #5677; llama.cpp `llama_sampler_dry`
    (ported from koboldcpp PR #982).

    Unlike llama.cpp, which turns breaker strings into every token sequence that can spell
    them, breakers here are single token ids that the caller chose for those strings; a breaker
    split across tokens, or a token that merely contains one, is not recognised.

    Args:
        logits: (..., V) float32.
        history: (T,) integer token ids, prompt and generated. Converted to host ints (which
            evaluates a lazy array) only when the stage is active.
        multiplier: Penalty scale; 0 disables the stage.
        base: Exponential base; below 1 disables the stage, as in llama.cpp.
        allowed_length: Longest repetition left unpenalised, in tokens.
        penalty_last_n: Tokens of history scanned; 0 disables, -1 scans all.
        breaker_ids: Token ids that break sequences.

    Returns:
        (..., V) float32 logits.
    """
    if multiplier == 0.0 or base < 1.0 or penalty_last_n == 0:
        return logits
    tokens = np.asarray(history, dtype=np.int64)
    window = tokens if not 0 < penalty_last_n < len(tokens) else tokens[-penalty_last_n:]
    if len(window) <= allowed_length:
        return logits
    lengths = _dry_repeat_lengths(window, allowed_length, breaker_ids)
    if not lengths:
        return logits
    max_exponent = int(_FLOAT32_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    penalties = []
    for length in lengths.values():
        exponent = length - allowed_length
        if max_exponent > 0:
            exponent = min(exponent, max_exponent)
        penalties.append(multiplier * base**exponent)
    vocab_size = logits.shape[-1]
    ids = mx.array(list(lengths), dtype=mx.int32)
    values = mx.array(penalties, dtype=mx.float32)
    return logits - mx.zeros((vocab_size,), dtype=mx.float32).at[ids].add(values)
