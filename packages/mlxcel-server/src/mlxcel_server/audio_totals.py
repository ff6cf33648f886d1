"""Running totals of the audio work a server has done, for `/metrics`."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

Direction = Literal["transcribed", "synthesized"]


@dataclass(frozen=True)
class AudioTotalsSnapshot:
    """Totals at one moment.

    Attributes:
        requests: finished requests by endpoint ("transcriptions", "translations", "speech").
        audio_seconds: seconds of audio by direction ("transcribed", "synthesized").
        processing_seconds: worker time spent by direction.
    """

    requests: dict[str, int] = field(default_factory=dict)
    audio_seconds: dict[str, float] = field(default_factory=dict)
    processing_seconds: dict[str, float] = field(default_factory=dict)


class AudioTotals:
    """Adds up finished audio requests; safe to use from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._audio_seconds: Counter[str] = Counter()
        self._processing_seconds: Counter[str] = Counter()

    def record(
        self,
        endpoint: str,
        direction: Direction,
        *,
        audio_seconds: float,
        processing_seconds: float,
    ) -> None:
        """Count one request to `endpoint` that handled `audio_seconds` of audio in
        `processing_seconds` of worker time."""
        with self._lock:
            self._requests[endpoint] += 1
            self._audio_seconds[direction] += audio_seconds
            self._processing_seconds[direction] += processing_seconds

    def snapshot(self) -> AudioTotalsSnapshot:
        """The totals so far."""
        with self._lock:
            return AudioTotalsSnapshot(
                dict(self._requests), dict(self._audio_seconds), dict(self._processing_seconds)
            )
