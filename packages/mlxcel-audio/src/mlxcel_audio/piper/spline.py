"""Inverse of the piecewise rational-quadratic spline with linear tails.

Durkan et al. 2019, "Neural Spline Flows"; ported from Piper's `vits/transforms.py`
(`unconstrained_rational_quadratic_spline` with `inverse=True`, `tails="linear"`).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

MIN_BIN_WIDTH = 1e-3
MIN_BIN_HEIGHT = 1e-3
MIN_DERIVATIVE = 1e-3


def inverse_rational_quadratic(
    y: mx.array,
    widths: mx.array,
    heights: mx.array,
    derivatives: mx.array,
    *,
    tail_bound: float,
) -> mx.array:
    """x such that spline(x) = y, elementwise; identity outside [-tail_bound, tail_bound].

    Args:
        y: (...,) float32.
        widths, heights: (..., K) unnormalized bin widths and heights.
        derivatives: (..., K - 1) unnormalized derivatives at the inner knots.
    """
    num_bins = widths.shape[-1]
    edge = math.log(math.exp(1 - MIN_DERIVATIVE) - 1)
    edges = mx.full((*derivatives.shape[:-1], 1), edge, dtype=derivatives.dtype)
    derivatives = MIN_DERIVATIVE + nn.softplus(mx.concatenate([edges, derivatives, edges], -1))
    cum_x, bin_x = _knots(widths, MIN_BIN_WIDTH, tail_bound)
    cum_y, bin_y = _knots(heights, MIN_BIN_HEIGHT, tail_bound)

    search = mx.concatenate([cum_y[..., :-1], cum_y[..., -1:] + 1e-6], axis=-1)
    index = mx.sum(y[..., None] >= search, axis=-1, keepdims=True) - 1
    index = mx.clip(index, 0, num_bins - 1)

    def pick(t: mx.array) -> mx.array:
        return mx.take_along_axis(t, index, axis=-1)[..., 0]

    x0, width = pick(cum_x), pick(bin_x)
    y0, height = pick(cum_y), pick(bin_y)
    delta = height / width
    d0, d1 = pick(derivatives[..., :-1]), pick(derivatives[..., 1:])

    offset = y - y0
    slope_sum = d0 + d1 - 2 * delta
    a = offset * slope_sum + height * (delta - d0)
    b = height * d0 - offset * slope_sum
    c = -delta * offset
    theta = (2 * c) / (-b - mx.sqrt(mx.maximum(b * b - 4 * a * c, 0.0)))
    x = theta * width + x0
    inside = (y >= -tail_bound) & (y <= tail_bound)
    return mx.where(inside, x, y)


def _knots(unnormalized: mx.array, min_size: float, bound: float) -> tuple[mx.array, mx.array]:
    """Knot positions (..., K + 1) spanning [-bound, bound] and bin sizes (..., K)."""
    num_bins = unnormalized.shape[-1]
    sizes = min_size + (1 - min_size * num_bins) * mx.softmax(unnormalized, axis=-1, precise=True)
    cumulative = mx.cumsum(sizes, axis=-1)
    inner = 2 * bound * cumulative[..., :-1] - bound
    low = mx.full((*inner.shape[:-1], 1), -bound, dtype=inner.dtype)
    knots = mx.concatenate([low, inner, -low], axis=-1)
    return knots, knots[..., 1:] - knots[..., :-1]
