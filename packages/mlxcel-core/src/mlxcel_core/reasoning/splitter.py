"""Splitting streamed model text into reasoning and answer, the markers removed."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


@dataclass(frozen=True)
class ReasoningMarkers:
    """The texts that delimit a model's reasoning span.

    Attributes:
        start: opens the span (`<think>`, or gpt-oss's `<|channel|>analysis<|message|>`).
        end: closes it (`</think>`, or gpt-oss's `<|end|>`).
        answer_start: for channel-style formats, what opens the answer after the span
            (gpt-oss's `<|channel|>final<|message|>`); text between `end` and it is framing
            and is dropped. None when the answer follows `end` directly.

    Raises:
        ValueError: a marker is empty.
    """

    start: str
    end: str
    answer_start: str | None = None

    def __post_init__(self) -> None:
        if not self.start or not self.end or self.answer_start == "":
            raise ValueError(f"reasoning markers must be non-empty, got {self!r}")


class ReasoningPhase(IntEnum):
    """Where a reply is: before any reasoning, inside it, between it and the answer, or in
    the answer (final: nothing after it is parsed as reasoning)."""

    BEFORE = 0
    REASONING = 1
    BETWEEN = 2
    ANSWER = 3


@dataclass(frozen=True)
class ReasoningDelta:
    """What one piece of text released.

    Attributes:
        reasoning: new reasoning text.
        content: new answer text.
    """

    reasoning: str = ""
    content: str = ""


class ReasoningSplitter:
    """Routes streamed text to reasoning or answer, removing the markers.

    Text that could still become a marker is held back until it is decided, so a marker split
    over several pieces never leaks. Whitespace at the start of the reasoning and of the
    answer, and at the end of the reasoning, is dropped (the newlines templates put around
    the markers), as llama-server trims both.

    Args:
        markers: the model's markers.
        phase: where the reply starts: `REASONING` when the prompt already opened the span
            (a template whose generation prompt ends with `<think>`), `ANSWER` when it
            closed it (thinking disabled), else `BEFORE`.
    """

    def __init__(
        self, markers: ReasoningMarkers, phase: ReasoningPhase = ReasoningPhase.BEFORE
    ) -> None:
        self._markers = markers
        self.phase = phase
        self._pending = ""
        # Trailing reasoning whitespace, released only if more reasoning follows it.
        self._held_space = ""
        self._at_segment_start = True

    def feed(self, text: str) -> ReasoningDelta:
        """Add the next piece of text; return what it decides."""
        self._pending += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._pending:
            if self.phase is ReasoningPhase.ANSWER:
                content.append(self._strip_segment_start(self._pending))
                self._pending = ""
                break
            found = self._next_marker()
            if found is None:
                decided = len(self._pending) - self._undecided_length()
                self._route(self._pending[:decided], reasoning, content)
                self._pending = self._pending[decided:]
                break
            index, marker, phase = found
            before, self._pending = self._pending[:index], self._pending[index:]
            self._route(before, reasoning, content)
            if self.phase is ReasoningPhase.ANSWER:
                continue
            self._pending = self._pending[len(marker) :]
            self._enter(phase)
        return ReasoningDelta("".join(reasoning), "".join(content))

    def finish(self) -> ReasoningDelta:
        """The text still held back once the reply has ended (an unfinished marker is text)."""
        pending, self._pending = self._pending, ""
        reasoning: list[str] = []
        content: list[str] = []
        self._route(pending, reasoning, content)
        return ReasoningDelta("".join(reasoning), "".join(content))

    def _targets(self) -> list[tuple[str, ReasoningPhase]]:
        markers = self._markers
        after_end = (
            ReasoningPhase.ANSWER if markers.answer_start is None else ReasoningPhase.BETWEEN
        )
        if self.phase is ReasoningPhase.REASONING:
            return [(markers.end, after_end)]
        targets = [(markers.start, ReasoningPhase.REASONING)]
        if markers.answer_start is not None:
            targets.append((markers.answer_start, ReasoningPhase.ANSWER))
        return targets

    def _next_marker(self) -> tuple[int, str, ReasoningPhase] | None:
        hits = [
            (index, marker, phase)
            for marker, phase in self._targets()
            if (index := self._pending.find(marker)) >= 0
        ]
        return min(hits, key=lambda hit: hit[0], default=None)

    def _undecided_length(self) -> int:
        """Length of the longest tail of the pending text that starts some marker."""
        longest = 0
        for marker, _ in self._targets():
            for length in range(min(len(marker) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(marker[:length]):
                    longest = length
                    break
        return longest

    def _enter(self, phase: ReasoningPhase) -> None:
        if phase is ReasoningPhase.REASONING and self.phase is ReasoningPhase.BETWEEN:
            # A second reasoning message continues the first on a new line.
            self._held_space = "\n"
            self._at_segment_start = False
        else:
            self._held_space = ""
            self._at_segment_start = True
        self.phase = phase

    def _strip_segment_start(self, text: str) -> str:
        if self._at_segment_start:
            text = text.lstrip()
            self._at_segment_start = not text
        return text

    def _route(self, text: str, reasoning: list[str], content: list[str]) -> None:
        if not text or self.phase is ReasoningPhase.BETWEEN:
            return
        if self.phase is not ReasoningPhase.REASONING:
            text = self._strip_segment_start(text)
            content.append(text)
            if text:
                # Reasoning comes first or not at all: a marker after answer text is text.
                self.phase = ReasoningPhase.ANSWER
            return
        text = self._strip_segment_start(self._held_space + text)
        body = text.rstrip()
        self._held_space = text[len(body) :]
        reasoning.append(body)
