"""Lloyd-Max scalar quantizers for the standard normal distribution.

Lloyd's algorithm (S. P. Lloyd, "Least squares quantization in PCM", 1957/1982; J. Max,
"Quantizing for minimum distortion", 1960) alternates the two optimality conditions of a
minimum mean-squared-error quantizer until they hold together: each boundary is the
midpoint of its two neighbouring levels, each level is the mean of the density between
its two boundaries. For N(0, 1) both have closed forms, so the iteration is exact.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

_MAX_ITERATIONS = 100_000
_TOLERANCE = 1e-12


@dataclass(frozen=True)
class Codebook:
    """A scalar quantizer of N(0, 1).

    Attributes:
        levels: the 2**bits reconstruction values, ascending.
        boundaries: the 2**bits - 1 decision thresholds, ascending; a value in
            (boundaries[i - 1], boundaries[i]] maps to levels[i].
        mse: the expected squared error E[(x - q(x))^2] for x ~ N(0, 1).
    """

    levels: tuple[float, ...]
    boundaries: tuple[float, ...]
    mse: float


def _pdf(t: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)


def _cdf(t: np.ndarray) -> np.ndarray:
    return np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in t])


def _cell_masses_and_means(boundaries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    edges = np.concatenate([[-np.inf], boundaries, [np.inf]])
    mass = np.diff(_cdf(edges))
    # E[x | a < x <= b] = (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)) for the standard normal.
    means = -np.diff(_pdf(edges)) / mass
    return mass, means


@functools.cache
def gaussian_codebook(bits: int) -> Codebook:
    """The MSE-optimal `bits`-bit quantizer of N(0, 1), computed once per `bits`.

    Raises:
        ValueError: `bits` is outside [1, 8].
    """
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in [1, 8], got {bits}")
    num_levels = 2**bits
    # Start from the quantiles' centres: already close, so few iterations are needed.
    levels = np.array(
        [math.sqrt(2) * _inverse_erf(2 * (i + 0.5) / num_levels - 1) for i in range(num_levels)]
    )
    for _ in range(_MAX_ITERATIONS):
        boundaries = (levels[1:] + levels[:-1]) / 2
        _, updated = _cell_masses_and_means(boundaries)
        converged = np.max(np.abs(updated - levels)) < _TOLERANCE
        levels = updated
        if converged:
            break
    boundaries = (levels[1:] + levels[:-1]) / 2
    mass, means = _cell_masses_and_means(boundaries)
    # With every level at its cell's mean, E[(x - q)^2] = E[x^2] - sum P_i * level_i^2.
    mse = 1.0 - float(np.sum(mass * means * means))
    return Codebook(tuple(levels.tolist()), tuple(boundaries.tolist()), mse)


def _inverse_erf(y: float) -> float:
    """erf^-1(y) for |y| < 1 by Newton's method on math.erf."""
    x = 0.0
    for _ in range(100):
        step = (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
        x -= step
        if abs(step) < 1e-15:
            break
    return x
