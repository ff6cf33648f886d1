"""One search: time a tactic's candidates for one bucket, decide, and make the entry."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlxcel_core.autotune.decision import Verdict, choose
from mlxcel_core.autotune.harness import Measurement, measure_interleaved
from mlxcel_core.tuning.store import TunedEntry


@dataclass(frozen=True)
class SearchResult:
    """The measurements of one tactic in one bucket and what they decided.

    Attributes:
        tactic: the tactic's name.
        bucket: the shape bucket searched.
        measurements: one per candidate, in the candidates' order.
        verdict: the candidate kept.
    """

    tactic: str
    bucket: str
    measurements: tuple[Measurement, ...]
    verdict: Verdict

    def entry(self) -> TunedEntry:
        """What the store keeps of it: the value to use and the two medians."""
        medians = {m.candidate: m.median for m in self.measurements}
        return TunedEntry(
            tactic=self.tactic,
            bucket=self.bucket,
            value=int(self.verdict.chosen),
            default=int(self.verdict.default),
            median_seconds=medians[self.verdict.chosen],
            default_median_seconds=medians[self.verdict.default],
        )


def search(
    tactic: str,
    bucket: str,
    candidates: Sequence[int],
    run: Callable[[int], object],
    *,
    default: int,
    rounds: int,
    timer: Callable[[], float] = time.perf_counter,
    on_round: Callable[[int], object] = lambda done: None,
) -> SearchResult:
    """Time `run` over `candidates` (`measure_interleaved`, `on_round` called after each
    round) and `choose` against `default`.

    Raises:
        ValueError: as `measure_interleaved` does, or `default` is not a candidate.
    """
    if default not in candidates:
        raise ValueError(f"default {default} must be among the candidates {list(candidates)}")
    measurements = measure_interleaved(
        candidates, run, rounds=rounds, timer=timer, on_round=on_round
    )
    return SearchResult(tactic, bucket, tuple(measurements), choose(measurements, default))
