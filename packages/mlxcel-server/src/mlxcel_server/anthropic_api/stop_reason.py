"""Why a reply ended, in Anthropic's terms: `end_turn`, `max_tokens`, `stop_sequence` or
`tool_use`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlxcel_core.request import FinishReason
from mlxcel_server.stop_strings import StopStringTracker

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


@dataclass(frozen=True)
class Ending:
    """A reply's `stop_reason`, and the stop sequence it met (`stop_sequence` only)."""

    stop_reason: StopReason
    stop_sequence: str | None = None


class EndingTracker(StopStringTracker):
    """Follows the tokens of one reply to tell, at its end, its `stop_reason` and the stop
    sequence it met (see `StopStringTracker`).

    Args:
        tokenizer: the model's tokenizer.
        stop_sequences: the request's stop sequences.
    """

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
        stop = self.stop_string_met()
        return Ending("end_turn") if stop is None else Ending("stop_sequence", stop)
