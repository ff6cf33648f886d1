"""Printing a streamed reply whose reasoning is hidden, or shown dimmed before the answer.

Commands that stream a reply (`generate`, the chat REPL) pass it here piece by piece; the
markers never print. Shown reasoning is ANSI-dimmed on a terminal and plain otherwise, and
a blank line separates it from the answer.
"""

from __future__ import annotations

from typing import TextIO

from mlxcel_core.reasoning import ReasoningMarkers, ReasoningPhase, ReasoningSplitter

DIM = "\x1b[2m"
RESET = "\x1b[0m"


class ReplyPrinter:
    """Writes one reply's reasoning and answer, already apart, to `out`.

    Args:
        out: where the reply goes.
        show: print the reasoning (else only the answer).
        dim: wrap shown reasoning in ANSI dim codes (for a terminal).
    """

    def __init__(self, out: TextIO, *, show: bool = False, dim: bool = False) -> None:
        self._out = out
        self._show = show
        self._dim = dim
        self._reasoning_shown = False
        self._answer_started = False

    def write_reasoning(self, text: str) -> None:
        """Print a piece of the reasoning, if reasoning is shown."""
        if not text or not self._show:
            return
        self._reasoning_shown = True
        self._out.write(f"{DIM}{text}{RESET}" if self._dim else text)
        self._out.flush()

    def write_answer(self, text: str) -> None:
        """Print a piece of the answer, a blank line after any reasoning shown."""
        if not text:
            return
        if self._reasoning_shown and not self._answer_started:
            self._out.write("\n\n")
        self._answer_started = True
        self._out.write(text)
        self._out.flush()


class ReasoningDisplay:
    """Writes one reply to `out`, its reasoning hidden or shown.

    Args:
        out: where the reply goes.
        markers: the model's reasoning markers, or None to print the text as it is.
        phase: where the reply starts (see `mlxcel_models.tokenizer.reasoning.opening_phase`).
        show: print the reasoning (else only the answer).
        dim: wrap shown reasoning in ANSI dim codes (for a terminal).
    """

    def __init__(
        self,
        out: TextIO,
        markers: ReasoningMarkers | None,
        phase: ReasoningPhase = ReasoningPhase.BEFORE,
        *,
        show: bool = False,
        dim: bool = False,
    ) -> None:
        self._out = out
        self._splitter = None if markers is None else ReasoningSplitter(markers, phase)
        self._printer = ReplyPrinter(out, show=show, dim=dim)

    def write(self, text: str) -> None:
        """Print the next piece of the reply (what of it is decided)."""
        if self._splitter is None:
            self._printer.write_answer(text)
            return
        delta = self._splitter.feed(text)
        self._printer.write_reasoning(delta.reasoning)
        self._printer.write_answer(delta.content)

    def finish(self) -> None:
        """Print what was held back once the reply has ended."""
        if self._splitter is not None:
            delta = self._splitter.finish()
            self._printer.write_reasoning(delta.reasoning)
            self._printer.write_answer(delta.content)
        self._out.flush()


def stream_is_terminal(out: TextIO) -> bool:
    """Whether `out` is a terminal, where dimmed text can be shown."""
    return out.isatty()
