"""Why a reply ended, in Anthropic's terms: `end_turn`, `max_tokens`, `stop_sequence` or
`tool_use`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mlxcel_core.engine import EngineOutput
from mlxcel_core.generate import FinishReason
from mlxcel_models.tokenizer import Tokenizer

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


@dataclass(frozen=True)
class Ending:
    """A reply's `stop_reason`, and the stop sequence it met (`stop_sequence` only)."""

    stop_reason: StopReason
    stop_sequence: str | None = None


def _first_stop_sequence(text: str, stop_sequences: Sequence[str]) -> str | None:
    found = [(text.find(stop), order, stop) for order, stop in enumerate(stop_sequences)]
    matches = sorted(entry for entry in found if entry[0] >= 0)
    return matches[0][2] if matches else None


class EndingTracker:
    """Follows the tokens of one reply to tell, at its end, which stop sequence it met.

    The engine reports only that a reply stopped (at an end-of-turn token or a stop string,
    both left out of its outputs' text); the tokens it sampled tell which. The engine stops
    at the first stop string the text holds, so a stopped reply met one exactly when its
    decoded tokens hold one, and the one it met is the earliest in the text (at a tie, the
    request's first).

    Args:
        tokenizer: the model's tokenizer.
        stop_sequences: the request's stop sequences.
    """

    def __init__(self, tokenizer: Tokenizer, stop_sequences: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._stop_sequences = tuple(stop_sequences)
        self._token_ids: list[int] = []

    def add(self, output: EngineOutput) -> None:
        """Take one engine output of the reply."""
        if output.token_id is not None:
            self._token_ids.append(output.token_id)

    def ending(self, finish_reason: FinishReason, *, calls_tools: bool) -> Ending:
        """The reply's ending, once its last output has been added.

        Args:
            finish_reason: the engine's finish reason.
            calls_tools: whether the reply holds tool calls (that makes it `tool_use`,
                unless the token limit cut it: `max_tokens`).
        """
        if finish_reason is FinishReason.LENGTH:
            return Ending("max_tokens")
        if calls_tools:
            return Ending("tool_use")
        if not self._stop_sequences:
            return Ending("end_turn")
        text = self._tokenizer.decode(self._token_ids)
        stop = _first_stop_sequence(text, self._stop_sequences)
        return Ending("end_turn") if stop is None else Ending("stop_sequence", stop)
