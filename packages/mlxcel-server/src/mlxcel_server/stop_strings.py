"""Which stop string ended a reply: the engine reports only that a reply stopped (at an
end-of-turn token or a stop string, both left out of its outputs' text); the tokens it
sampled tell which."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcel_core.engine import EngineOutput
from mlxcel_models.tokenizer import Tokenizer


def _first_stop_string(text: str, stop_strings: Sequence[str]) -> str | None:
    found = [(text.find(stop), order, stop) for order, stop in enumerate(stop_strings)]
    matches = sorted(entry for entry in found if entry[0] >= 0)
    return matches[0][2] if matches else None


class StopStringTracker:
    """Follows the tokens of one reply to tell, at its end, which stop string it met.

    The engine stops at the first stop string the text holds, so a reply that stopped met
    one exactly when its decoded tokens hold one, and the one it met is the earliest in the
    text (at a tie, the request's first).

    Args:
        tokenizer: the model's tokenizer.
        stop_strings: the request's stop strings.
    """

    def __init__(self, tokenizer: Tokenizer, stop_strings: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._stop_strings = tuple(stop_strings)
        self._token_ids: list[int] = []

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The reply's sampled tokens so far."""
        return tuple(self._token_ids)

    def add(self, output: EngineOutput) -> None:
        """Take one engine output of the reply."""
        if output.token_id is not None:
            self._token_ids.append(output.token_id)

    def stop_string_met(self) -> str | None:
        """The stop string a reply that stopped (not at its token limit) met; None when it
        ended at an end-of-turn token."""
        if not self._stop_strings:
            return None
        return _first_stop_string(self._tokenizer.decode(self._token_ids), self._stop_strings)
