"""Stop strings matched on streamed text, across token boundaries, never leaked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    """What a piece of streamed text released.

    Attributes:
        text: text safe to show now (everything before any stop string).
        stopped: True once a stop string has been seen; later text is dropped.
    """

    text: str
    stopped: bool


class StopStringMatcher:
    """Holds back text that could still turn into a stop string.

    After each piece, the longest tail of the pending text that is a prefix of some stop
    string is kept back; everything before it is released. When a stop string appears
    whole, the text before it is released and the rest is discarded.

    Args:
        stop_strings: strings that end generation; empty strings are ignored.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self._stop_strings = tuple(s for s in stop_strings if s)
        self._pending = ""
        self._stopped = False

    def feed(self, text: str) -> StopMatch:
        """Add newly decoded text; return what may be shown and whether to stop."""
        if self._stopped:
            return StopMatch("", True)
        pending = self._pending + text
        first_stop = min(
            (index for s in self._stop_strings if (index := pending.find(s)) >= 0),
            default=-1,
        )
        if first_stop >= 0:
            self._pending, self._stopped = "", True
            return StopMatch(pending[:first_stop], True)
        held = self._held_back_length(pending)
        self._pending = pending[len(pending) - held :]
        return StopMatch(pending[: len(pending) - held], False)

    def flush(self) -> str:
        """Release the text held back when generation ends for another reason."""
        pending, self._pending = self._pending, ""
        return "" if self._stopped else pending

    def _held_back_length(self, text: str) -> int:
        longest = 0
        for stop in self._stop_strings:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
