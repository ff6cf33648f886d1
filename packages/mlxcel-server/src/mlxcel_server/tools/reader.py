"""Reading tool calls out of a reply as it is generated, in its convention.

`ToolCallReader` takes the reply's text in pieces and gives back what each piece adds: text
(content) and call deltas (a call's name when it is known, then its arguments as they are
written). A whole reply is read the same way (`read_reply`), so a streamed reply and an
unstreamed one say the same thing.

Whitespace is held back until it is followed by text: whitespace next to tool markup, or at
the end of a reply that calls tools, is dropped. Markup that breaks off (a reply cut at the
token limit, or one generated without a grammar) ends its call where it broke; the rest of
the reply is content.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

from mlxcel_server.tools.conventions import LAYOUTS, PYTHON_TAG, CallLayout, ToolCallFormat
from mlxcel_server.tools.json_scan import JsonScanner, Path, ScannedChar

_WHITESPACE = " \t\n\r"


@dataclass(frozen=True)
class CallDelta:
    """A piece of one tool call.

    Attributes:
        index: the call's position among the reply's calls (0, 1, ...).
        name: the function's name, on the call's first delta only.
        arguments: the next piece of its arguments' JSON text.
    """

    index: int
    name: str | None
    arguments: str


@dataclass(frozen=True)
class ReadPiece:
    """What a piece of reply adds: its text and its call deltas, in order of the calls."""

    content: str = ""
    calls: tuple[CallDelta, ...] = ()

    def __add__(self, other: ReadPiece) -> ReadPiece:
        return ReadPiece(self.content + other.content, self.calls + other.calls)


@dataclass(frozen=True)
class ParsedToolCall:
    """One tool call.

    Attributes:
        name: the function's name.
        arguments: its arguments as written: JSON text of an object (partial when the
            reply was cut short).
    """

    name: str
    arguments: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")

    def arguments_object(self) -> dict | None:
        """The arguments parsed, or None when they are not a whole JSON object."""
        try:
            value = json.loads(self.arguments)
        except (ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into text and tool calls.

    Attributes:
        content: the text outside tool markup; None when there is none.
        tool_calls: the calls, in the order written.
    """

    content: str | None
    tool_calls: tuple[ParsedToolCall, ...] = ()


class _Mode(enum.Enum):
    START = enum.auto()  # before the first non-whitespace character (reply-is-JSON formats)
    TEXT = enum.auto()  # text, watching for the opening marker
    JSON = enum.auto()
    CLOSING = enum.auto()  # after a call's JSON, watching for the closing marker
    PLAIN = enum.auto()  # text to the end


@dataclass
class _Call:
    path: Path
    name_text: str = ""
    name: str | None = None
    index: int | None = None
    arguments_key: str | None = None
    held_arguments: list[str] = field(default_factory=list)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class ToolCallReader:
    """Splits one reply into content and tool calls as its text arrives.

    Args:
        tool_format: the reply's convention.
        parallel: whether the reply may make several calls; else calls after the first
            are dropped.
    """

    def __init__(self, tool_format: ToolCallFormat, *, parallel: bool = True) -> None:
        self._layout: CallLayout = LAYOUTS[tool_format]
        self._format = tool_format
        self._parallel = parallel
        self._mode = _Mode.TEXT if self._layout.opening else _Mode.START
        self._buffer = ""  # text not yet placed (a marker may be starting in it)
        self._scanner = JsonScanner()
        self._call: _Call | None = None
        self._num_calls = 0
        self._held_space = ""
        self._after_markup = False
        # Reply-is-JSON formats: until the JSON's first key tells whether it is a call, its
        # text and deltas are held.
        self._undecided: list[str] | None = None
        self._held_deltas: list[CallDelta] = []
        self._out_content: list[str] = []
        self._out_calls: list[CallDelta] = []

    @property
    def num_calls(self) -> int:
        """The calls reported so far."""
        return self._num_calls

    def feed(self, text: str) -> ReadPiece:
        """Add newly generated text; returns the content and call deltas it adds."""
        self._buffer += text
        self._advance(final=False)
        return self._take()

    def finish(self) -> ReadPiece:
        """Place what was held back, once the reply is complete."""
        self._advance(final=True)
        if self._undecided is not None:
            self._release_undecided()
        if self._buffer:
            self._content(self._buffer)
            self._buffer = ""
        if not self._num_calls:
            self._out_content.append(self._held_space)
        self._held_space = ""
        return self._take()

    def _take(self) -> ReadPiece:
        merged: list[CallDelta] = []
        for delta in self._out_calls:
            last = merged[-1] if merged else None
            if last is not None and last.index == delta.index and delta.name is None:
                merged[-1] = CallDelta(last.index, last.name, last.arguments + delta.arguments)
            else:
                merged.append(delta)
        piece = ReadPiece("".join(self._out_content), tuple(merged))
        self._out_content, self._out_calls = [], []
        return piece

    def _content(self, text: str) -> None:
        if self._after_markup:
            text = text.lstrip(_WHITESPACE)
            self._after_markup = not text
        if not text:
            return
        stripped = text.rstrip(_WHITESPACE)
        if not stripped:
            self._held_space += text
            return
        self._out_content.append(self._held_space + stripped)
        self._held_space = text[len(stripped) :]

    def _advance(self, *, final: bool) -> None:
        while self._buffer:
            before = (self._mode, len(self._buffer))
            if self._mode is _Mode.PLAIN:
                self._content(self._buffer)
                self._buffer = ""
            elif self._mode is _Mode.START:
                self._start(final)
            elif self._mode is _Mode.TEXT:
                self._text(final)
            elif self._mode is _Mode.JSON:
                self._json()
            else:
                self._closing(final)
            if (self._mode, len(self._buffer)) == before:
                return  # waiting for more text

    def _start(self, final: bool) -> None:
        head = self._buffer.lstrip(_WHITESPACE)
        if self._format is ToolCallFormat.LLAMA3_JSON and head.startswith(PYTHON_TAG):
            self._buffer = head[len(PYTHON_TAG) :]
            return
        if not head or (
            self._format is ToolCallFormat.LLAMA3_JSON and PYTHON_TAG.startswith(head) and not final
        ):
            if final:
                self._mode = _Mode.PLAIN
            return
        if head.startswith("{"):
            self._undecided = []
            self._buffer = head
            self._mode = _Mode.JSON
        else:
            self._mode = _Mode.PLAIN

    def _text(self, final: bool) -> None:
        marker = self._layout.opening
        start = self._buffer.find(marker)
        if start >= 0:
            self._content(self._buffer[:start])
            self._held_space = ""
            self._buffer = self._buffer[start + len(marker) :]
            self._scanner = JsonScanner()
            self._mode = _Mode.JSON
            return
        keep = 0 if final else _partial_suffix(self._buffer, marker)
        self._content(self._buffer[: len(self._buffer) - keep])
        self._buffer = self._buffer[len(self._buffer) - keep :]

    def _closing(self, final: bool) -> None:
        marker = self._layout.closing
        head = self._buffer.lstrip(_WHITESPACE)
        if head.startswith(marker):
            self._buffer = head[len(marker) :]
            self._mode = _Mode.TEXT
            self._after_markup = True
        elif head and (final or not marker.startswith(head)):
            self._buffer = head
            self._mode = _Mode.TEXT
        elif final:
            self._buffer = ""

    def _json(self) -> None:
        for position, char in enumerate(self._buffer):
            scanned = self._scanner.feed(char)
            if self._scanner.failed:
                self._broken(self._buffer[position:])
                return
            if self._undecided is not None:
                self._undecided.append(char)
            self._place(char, scanned)
            if self._undecided is not None and scanned.key is not None and scanned.key[0] == ():
                self._decide(scanned.key[1])
                if self._mode is _Mode.PLAIN:
                    self._buffer = self._buffer[position + 1 :]
                    return
            if self._scanner.done:
                self._buffer = self._buffer[position + 1 :]
                if self._undecided is not None:  # a JSON answer without keys
                    self._release_undecided()
                    return
                self._call = None
                self._after_markup = True
                self._mode = _Mode.CLOSING if self._layout.closing else _Mode.TEXT
                if not self._layout.opening:
                    self._mode = _Mode.PLAIN
                return
        self._buffer = ""

    def _decide(self, first_key: str) -> None:
        """A reply-is-JSON format: the first key tells a call from a JSON answer."""
        is_call = (
            first_key == self._layout.call_path[0]
            if self._layout.call_path
            else (first_key == "name")
        )
        if is_call:
            self._undecided = None
            self._out_calls.extend(self._held_deltas)
            self._held_deltas = []
        else:
            self._release_undecided()

    def _release_undecided(self) -> None:
        assert self._undecided is not None
        held = "".join(self._undecided)
        self._undecided = None
        self._held_deltas = []
        self._num_calls = 0
        self._call = None
        self._mode = _Mode.PLAIN
        self._content(held)

    def _broken(self, rest: str) -> None:
        if self._undecided is not None:
            self._undecided.append(rest)
            self._buffer = ""
            self._release_undecided()
            return
        self._call = None
        self._mode = _Mode.PLAIN
        self._buffer = rest

    def _emit(self, delta: CallDelta) -> None:
        if self._undecided is not None:
            self._held_deltas.append(delta)
        else:
            self._out_calls.append(delta)

    def _place(self, char: str, scanned: ScannedChar) -> None:
        """Follow the calls through one scanned character."""
        path = scanned.path
        if path is None:
            return
        call = self._call
        if call is None or path[: len(call.path)] != call.path:
            if not (self._layout.is_call(path) and char == "{"):
                return
            call = self._call = _Call(path)
        depth = len(call.path)
        key = scanned.key
        if key is not None and key[0] == call.path and call.arguments_key is None:
            call.arguments_key = key[1] if key[1] in self._layout.arguments_keys else None
        if path[depth:] == ("name",):
            call.name_text += char
            if path in scanned.ended:
                self._named(call)
        elif call.arguments_key is not None and path[depth : depth + 1] == (call.arguments_key,):
            if call.index is not None:
                self._emit(CallDelta(call.index, None, char))
            else:
                call.held_arguments.append(char)
        if call.path in scanned.ended:
            self._call = None

    def _named(self, call: _Call) -> None:
        try:
            name = json.loads(call.name_text)
        except ValueError:
            return
        if not isinstance(name, str) or not name or (self._num_calls and not self._parallel):
            return
        call.name, call.index = name, self._num_calls
        self._num_calls += 1
        self._held_space = ""
        self._emit(CallDelta(call.index, name, "".join(call.held_arguments)))
        call.held_arguments = []


def read_reply(text: str, tool_format: ToolCallFormat, *, parallel: bool = True) -> ParsedReply:
    """A whole reply's content and tool calls, read as `ToolCallReader` reads a stream."""
    reader = ToolCallReader(tool_format, parallel=parallel)
    piece = reader.feed(text) + reader.finish()
    return collect(piece)


def collect(piece: ReadPiece) -> ParsedReply:
    """The reply a stream of content and call deltas adds up to."""
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for delta in piece.calls:
        if delta.name is not None:
            names[delta.index] = delta.name
        arguments.setdefault(delta.index, []).append(delta.arguments)
    calls = tuple(ParsedToolCall(names[i], "".join(arguments[i])) for i in sorted(names))
    return ParsedReply(piece.content or None, calls)
