"""Truncation and temperature stages of the sampler chain.

Each stage takes logits of shape (..., V) float32 and returns logits of the same shape, with
removed candidates set to -inf so that a later softmax renormalises over the survivors, as
llama.cpp's shrinking candidate list does. Every stage keeps at least one token, and each
mirrors its sampler in llama.cpp `src/llama-sampling.cpp`.
"""

import math

import mlx.core as mx

from mlxcel_core.sampling.params import is_greedy

_NEG_INF = float("-inf")


def _to_vocab_order(sorted_values: mx.array, order: mx.array) -> mx.array:
    """Scatter values given in `order` (an argsort along the last axis) back to token order."""
    return mx.put_along_axis(mx.zeros_like(sorted_values), order, sorted_values, axis=-1)


def _ranks_below(order: mx.array, count: mx.array) -> mx.array:
    """Mask, in token order, of the tokens whose position in `order` is below `count` (..., 1)."""
    positions = mx.arange(order.shape[-1])
    return _to_vocab_order(positions < count, order)


def apply_top_k(logits: mx.array, top_k: int) -> mx.array:
    """Keep the `top_k` highest logits.

    Source: Fan et al. 2018, "Hierarchical Neural Story Generation"; llama.cpp
    `llama_sampler_top_k`.

    Args:
        logits: (..., V) float32.
        top_k: Tokens to keep; 0 (or >= V) disables the stage.

    Returns:
        (..., V) float32 logits.
    """
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    removed = mx.argpartition(-logits, kth=top_k - 1, axis=-1)[..., top_k:]
    return mx.put_along_axis(logits, removed, mx.array(_NEG_INF, dtype=logits.dtype), axis=-1)


def apply_top_p(logits: mx.array, top_p: float) -> mx.array:
    """Nucleus sampling: keep the most likely tokens until their probability reaches `top_p`.

    The token whose probability crosses `top_p` is kept, as is the most likely token.
    Source: Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration"; llama.cpp
    `llama_sampler_top_p`.

    Args:
        logits: (..., V) float32.
        top_p: Probability mass in [0, 1]; 1.0 disables the stage.

    Returns:
        (..., V) float32 logits.
    """
    if top_p >= 1.0:
        return logits
    order = mx.argsort(-logits, axis=-1)
    sorted_probs = mx.take_along_axis(mx.softmax(logits, axis=-1), order, axis=-1)
    mass_before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs
    num_kept = mx.maximum((mass_before < top_p).sum(axis=-1, keepdims=True), 1)
    return mx.where(_ranks_below(order, num_kept), logits, _NEG_INF)


def apply_min_p(logits: mx.array, min_p: float) -> mx.array:
    """Keep tokens whose probability is at least `min_p` times the largest probability.

    Compared in logit space: keep l >= max(l) + log(min_p). Source: Nguyen et al. 2024,
    "Turning Up the Heat: Min-p Sampling for Creative and Coherent LLM Outputs"; llama.cpp
    `llama_sampler_min_p`.

    Args:
        logits: (..., V) float32.
        min_p: Scale in [0, 1]; 0.0 disables the stage.

    Returns:
        (..., V) float32 logits.
    """
    if min_p <= 0.0:
        return logits
    threshold = logits.max(axis=-1, keepdims=True) + math.log(min_p)
    return mx.where(logits >= threshold, logits, _NEG_INF)


def apply_typical_p(logits: mx.array, typical_p: float) -> mx.array:
    """Locally typical sampling: keep the tokens whose surprisal is closest to the entropy.

    Tokens are ranked by |-log p - H| and kept, in that order, until their probability exceeds
    `typical_p` (the crossing token included). Source: Meister et al. 2022, "Locally Typical
    Sampling"; llama.cpp `llama_sampler_typical`.

    Args:
        logits: (..., V) float32.
        typical_p: Probability mass in [0, 1]; 1.0 disables the stage.

    Returns:
        (..., V) float32 logits.
    """
    if typical_p >= 1.0:
        return logits
    log_probs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    probs = mx.exp(log_probs)
    # Removed tokens have p = 0 and log p = -inf; their 0 * -inf term must count as 0.
    entropy = -mx.where(probs > 0, probs * log_probs, 0.0).sum(axis=-1, keepdims=True)
    order = mx.argsort(mx.abs(-log_probs - entropy), axis=-1)
    sorted_probs = mx.take_along_axis(probs, order, axis=-1)
    mass_before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs
    num_kept = mx.maximum((mass_before <= typical_p).sum(axis=-1, keepdims=True), 1)
    return mx.where(_ranks_below(order, num_kept), logits, _NEG_INF)


def apply_top_n_sigma(logits: mx.array, top_n_sigma: float) -> mx.array:
    """Keep logits within `top_n_sigma` standard deviations of the largest logit.

    Mean and (population) standard deviation are taken over the surviving (finite) logits.
    Source: Tang et al. 2024, "Top-n-sigma: Not All Logits Are You Need"; llama.cpp
    `llama_sampler_top_n_sigma`.

    Args:
        logits: (..., V) float32.
        top_n_sigma: Number of standard deviations; <= 0 disables the stage.

    Returns:
        (..., V) float32 logits.
    """
    if top_n_sigma <= 0.0:
        return logits
    finite = logits > _NEG_INF
    count = finite.sum(axis=-1, keepdims=True)
    mean = mx.where(finite, logits, 0.0).sum(axis=-1, keepdims=True) / count
    variance = mx.where(finite, mx.square(logits - mean), 0.0).sum(axis=-1, keepdims=True) / count
    threshold = logits.max(axis=-1, keepdims=True) - top_n_sigma * mx.sqrt(variance)
    return mx.where(logits >= threshold, logits, _NEG_INF)


def apply_xtc(
    logits: mx.array, probability: float, threshold: float, draw: mx.array | float
) -> mx.array:
    """Exclude Top Choices: with chance `probability`, drop all but the least likely top choice.

    The top choices are the tokens with probability >= `threshold`; when there are two or more,
    all of them except the least probable are removed, so the stage favours a less obvious but
    still plausible continuation. Source: p-e-w, text-generation-webui PR #6335; llama.cpp
    `llama_sampler_xtc`.

    Args:
        logits: (..., V) float32.
        probability: Chance in [0, 1] that the stage acts on this step; 0 disables it.
        threshold: Probability a top choice needs; above 0.5 disables the stage (at most one
            token can reach it), as in llama.cpp.
        draw: A uniform [0, 1) random number, scalar (float or mx.array, may be lazy); the
            stage acts when `draw < probability`.

    Returns:
        (..., V) float32 logits.
    """
    if probability <= 0.0 or threshold > 0.5:
        return logits
    order = mx.argsort(-logits, axis=-1)
    num_top = (mx.softmax(logits, axis=-1) >= threshold).sum(axis=-1, keepdims=True)
    removed = _ranks_below(order, num_top - 1)
    return mx.where(mx.logical_and(removed, draw < probability), _NEG_INF, logits)


def apply_temperature(logits: mx.array, temperature: float) -> mx.array:
    """Divide the logits by the temperature; at or below 0 keep only the argmax.

    Source: Ackley, Hinton and Sejnowski 1985 (Boltzmann sampling); llama.cpp
    `llama_sampler_temp` (`temp <= 0` keeps the first highest logit only).

    Args:
        logits: (..., V) float32.
        temperature: Divisor; <= 0 means greedy.

    Returns:
        (..., V) float32 logits.
    """
    if not is_greedy(temperature):
        return logits / temperature
    best = mx.argmax(logits, axis=-1, keepdims=True)
    return mx.where(mx.arange(logits.shape[-1]) == best, logits, _NEG_INF)
