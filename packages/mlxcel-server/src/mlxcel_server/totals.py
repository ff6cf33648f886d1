"""Running totals of the generation work a server has done, for `/metrics`."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from mlxcel_core.request import GenerationStats


@dataclass(frozen=True)
class TotalsSnapshot:
    """Totals at one moment.

    Attributes:
        prompt_tokens: prompt tokens prefilled.
        prompt_seconds: time spent prefilling them (to each choice's first token).
        predicted_tokens: tokens generated, stop tokens included.
        predicted_seconds: time spent decoding (after each choice's first token).
    """

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0


class GenerationTotals:
    """Adds up finished choices' statistics; safe to use from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = TotalsSnapshot()

    def record(self, stats: GenerationStats) -> None:
        """Count one finished choice."""
        with self._lock:
            totals = self._totals
            self._totals = TotalsSnapshot(
                prompt_tokens=totals.prompt_tokens + stats.prompt_tokens,
                prompt_seconds=totals.prompt_seconds + stats.prompt_seconds,
                predicted_tokens=totals.predicted_tokens + stats.generated_tokens,
                predicted_seconds=totals.predicted_seconds + stats.decode_seconds,
            )

    def snapshot(self) -> TotalsSnapshot:
        """The totals so far."""
        with self._lock:
            return self._totals
