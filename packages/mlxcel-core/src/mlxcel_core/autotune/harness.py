"""Interleaved median-of-N timing of a tactic's candidates.

Round r times every candidate once, in the candidate order rotated by r places, so slow
drift (clock boost decaying, the machine's other load, caches filling) falls on every
candidate alike instead of on whichever was timed last; each candidate is called once,
untimed, before the first round (compilation, allocation, first-touch of memory).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

Candidate = TypeVar("Candidate", bound=Hashable)


@dataclass(frozen=True)
class Measurement:
    """The timings of one candidate.

    Attributes:
        candidate: the tactic's value that was timed.
        samples: seconds per timed call, in round order (at least 2).
    """

    candidate: Hashable
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        """The median of the samples (seconds)."""
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """The interquartile range of the samples (seconds): the width of their middle half.

        It ignores one outlier at either end once there are five samples or more, where the
        full range would let a single stall (a page fault, another process) hide every
        difference, yet it grows with the jitter the timings really have.
        """
        first, _, third = statistics.quantiles(self.samples, n=4, method="inclusive")
        return third - first


def measure_interleaved(
    candidates: Sequence[Candidate],
    run: Callable[[Candidate], object],
    *,
    rounds: int,
    timer: Callable[[], float] = time.perf_counter,
    on_round: Callable[[int], object] = lambda done: None,
) -> list[Measurement]:
    """Time `run(candidate)` for every candidate, `rounds` times each, interleaved.

    `run` must finish its work before returning: for MLX, evaluate the result (`mx.eval`)
    or wait for the output it produces, since MLX computes lazily and a call that returns
    a lazy array is timed at nearly zero.

    Args:
        candidates: the values to time, at least one, each once.
        run: does the work of one candidate; its return value is ignored.
        rounds: timed calls per candidate (>= 2, so that each has a spread).
        timer: seconds from an arbitrary origin; `time.perf_counter` unless a test fakes it.
        on_round: called with the number of rounds done after each round (1 to `rounds`).

    Returns:
        One `Measurement` per candidate, in the order of `candidates`.

    Raises:
        ValueError: `candidates` is empty or holds a value twice, or `rounds` < 2.
    """
    if not candidates:
        raise ValueError("candidates must hold at least one value")
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"candidates must be distinct, got {list(candidates)}")
    if rounds < 2:
        raise ValueError(f"rounds must be >= 2, got {rounds}")
    for candidate in candidates:
        run(candidate)
    samples: dict[Candidate, list[float]] = {candidate: [] for candidate in candidates}
    for round_index in range(rounds):
        for candidate in rotated(candidates, round_index):
            start = timer()
            run(candidate)
            samples[candidate].append(timer() - start)
        on_round(round_index + 1)
    return [Measurement(candidate, tuple(samples[candidate])) for candidate in candidates]


def rotated(candidates: Sequence[Candidate], shift: int) -> list[Candidate]:
    """`candidates` starting at index `shift` (modulo their number) and wrapping around."""
    start = shift % len(candidates)
    return [*candidates[start:], *candidates[:start]]
