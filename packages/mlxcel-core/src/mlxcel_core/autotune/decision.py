"""Which candidate a search keeps: the fastest, only when it beats the default clearly.

The rule: the candidate with the lowest median replaces the default only when the
default's median exceeds it by more than the two samples' spreads (interquartile ranges)
added. The middle halves of the two samples then cannot overlap, so a winner that is
faster only by the timings' own jitter is refused and the default stays.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from mlxcel_core.autotune.harness import Measurement


@dataclass(frozen=True)
class Verdict:
    """The outcome of one search.

    Attributes:
        default: the value used without tuning.
        best: the candidate with the lowest median (possibly the default itself).
        accepted: whether `best` replaced the default.
        margin: the default's median minus the best's (seconds).
        threshold: what `margin` had to exceed: the two samples' spreads added (seconds).
    """

    default: Hashable
    best: Hashable
    accepted: bool
    margin: float
    threshold: float

    @property
    def chosen(self) -> Hashable:
        """The value to use: `best` if accepted, else `default`."""
        return self.best if self.accepted else self.default

    def describe(self) -> str:
        """One line: the winner stored, or why the default stayed."""
        if self.accepted:
            return (
                f"winner {self.best}: {self.margin * 1e3:.3f} ms faster than the default "
                f"{self.default}, more than the spread ({self.threshold * 1e3:.3f} ms)"
            )
        if self.best == self.default:
            return f"default kept: the default {self.default} was the fastest"
        return (
            f"default kept: best {self.best} did not beat the default {self.default} by "
            f"more than the spread ({self.margin * 1e3:.3f} ms <= "
            f"{self.threshold * 1e3:.3f} ms)"
        )


def choose(measurements: Sequence[Measurement], default: Hashable) -> Verdict:
    """Apply the module's rule to one search's measurements.

    Args:
        measurements: one per candidate, the default among them.
        default: the value used without tuning.

    Raises:
        ValueError: no measurement is of `default`.
    """
    by_candidate = {measurement.candidate: measurement for measurement in measurements}
    if default not in by_candidate:
        raise ValueError(f"default {default!r} is not among the measured candidates")
    baseline = by_candidate[default]
    best = min(measurements, key=lambda measurement: measurement.median)
    margin = baseline.median - best.median
    threshold = baseline.spread + best.spread
    accepted = best.candidate != default and margin > threshold
    return Verdict(default, best.candidate, accepted, margin, threshold)
