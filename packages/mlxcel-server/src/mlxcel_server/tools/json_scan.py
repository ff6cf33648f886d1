"""A JSON value read one character at a time, telling where each character sits.

Tool calls are streamed while they are generated, so their JSON is never parsed whole: each
character is placed in the value it belongs to (its path of object keys and array indices),
which is all it takes to pick out a call's name and to pass its arguments on as they come.
The grammar that constrains generation makes the JSON valid; an invalid character stops the
scan (`failed`), and the caller decides what the rest of the text is.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

Path = tuple[str | int, ...]

_WHITESPACE = " \t\n\r"
_LITERAL_CHARS = frozenset("0123456789+-.eEtruefalsn")


class _State(enum.Enum):
    VALUE = enum.auto()  # a value must start (after `:`, `[`, `,` in an array, or at the root)
    VALUE_OR_END = enum.auto()  # after `[`: a value or `]`
    KEY = enum.auto()  # after `,` in an object: a key
    KEY_OR_END = enum.auto()  # after `{`: a key or `}`
    COLON = enum.auto()
    AFTER_VALUE = enum.auto()  # `,` or the container's end
    STRING = enum.auto()
    ESCAPE = enum.auto()
    LITERAL = enum.auto()  # a number, true, false or null
    DONE = enum.auto()
    FAILED = enum.auto()


@dataclass
class _Container:
    is_object: bool
    key: str | int | None = None  # the current member's key, or the array's next index


@dataclass(frozen=True)
class ScannedChar:
    """Where one character sits.

    Attributes:
        path: the path of the innermost value holding it (a container's own characters,
            its keys and separators, belong to the container); None for whitespace around
            the root value.
        ended: paths of the values this character completed, innermost first (a number
            ends with the character after it).
        key: the object key this character completed, with the path of its object.
    """

    path: Path | None
    ended: tuple[Path, ...] = ()
    key: tuple[Path, str] | None = None


class JsonScanner:
    """Follows one JSON value (RFC 8259), character by character. Strings, nesting and
    separators are checked; the characters of numbers and literals are not (the grammar
    that generated them has).

    Attributes:
        done: the root value is complete; later characters are not scanned.
        failed: a character broke the JSON; later characters are not scanned.
    """

    def __init__(self) -> None:
        self._stack: list[_Container] = []
        self._state = _State.VALUE
        self._string_is_key = False
        self._key_chars: list[str] = []

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    @property
    def failed(self) -> bool:
        return self._state is _State.FAILED

    def _member_path(self) -> Path:
        """The path of the value being read or about to start."""
        return tuple(c.key for c in self._stack if c.key is not None)

    def _container_path(self) -> Path:
        """The path of the innermost container (its keys and separators are its own)."""
        return tuple(c.key for c in self._stack[:-1] if c.key is not None)

    def feed(self, char: str) -> ScannedChar:
        """Scan one character.

        Returns:
            Where it sits; after `done` or `failed`, a `ScannedChar` with no path.
        """
        state = self._state
        if state in (_State.DONE, _State.FAILED):
            return ScannedChar(None)
        if state is _State.LITERAL:
            if char in _LITERAL_CHARS:
                return ScannedChar(self._member_path())
            ended = self._member_path()
            self._end_value()
            after = self.feed(char)
            return ScannedChar(after.path, (ended, *after.ended), after.key)
        if state in (_State.STRING, _State.ESCAPE):
            return self._string_char(char)
        if char in _WHITESPACE:
            return ScannedChar(self._container_path() if self._stack else None)
        return self._structural(char)

    def _string_char(self, char: str) -> ScannedChar:
        is_key = self._string_is_key
        path = self._container_path() if is_key else self._member_path()
        if self._state is _State.ESCAPE or char == "\\":
            self._state = _State.STRING if self._state is _State.ESCAPE else _State.ESCAPE
            if is_key:
                self._key_chars.append(char)
            return ScannedChar(path)
        if char != '"':
            if ord(char) < 0x20:
                self._state = _State.FAILED
                return ScannedChar(None)
            if is_key:
                self._key_chars.append(char)
            return ScannedChar(path)
        if is_key:
            key = _decode_key("".join(self._key_chars))
            self._stack[-1].key = key
            self._state = _State.COLON
            return ScannedChar(path, key=(path, key))
        self._end_value()
        return ScannedChar(path, (path,))

    def _structural(self, char: str) -> ScannedChar:
        state = self._state
        if state is _State.VALUE or (state is _State.VALUE_OR_END and char != "]"):
            return self._start_value(char)
        top = self._stack[-1] if self._stack else None
        if top is not None and state is _State.VALUE_OR_END:
            return self._close()
        if top is not None and state in (_State.KEY, _State.KEY_OR_END) and char == '"':
            self._string_is_key = True
            self._key_chars = []
            self._state = _State.STRING
            return ScannedChar(self._container_path())
        if top is not None and state is _State.KEY_OR_END and char == "}":
            return self._close()
        if top is not None and state is _State.COLON and char == ":":
            self._state = _State.VALUE
            return ScannedChar(self._container_path())
        if top is not None and state is _State.AFTER_VALUE:
            if char == ",":
                path = self._container_path()
                if top.is_object:
                    top.key = None
                self._state = _State.KEY if top.is_object else _State.VALUE
                return ScannedChar(path)
            if char == ("}" if top.is_object else "]"):
                return self._close()
        self._state = _State.FAILED
        return ScannedChar(None)

    def _start_value(self, char: str) -> ScannedChar:
        path = self._member_path()
        if char in "{[":
            is_object = char == "{"
            self._stack.append(_Container(is_object, None if is_object else 0))
            self._state = _State.KEY_OR_END if is_object else _State.VALUE_OR_END
        elif char == '"':
            self._string_is_key = False
            self._state = _State.STRING
        elif char in _LITERAL_CHARS:
            self._state = _State.LITERAL
        else:
            self._state = _State.FAILED
            return ScannedChar(None)
        return ScannedChar(path)

    def _close(self) -> ScannedChar:
        path = self._container_path()
        self._stack.pop()
        self._end_value()
        return ScannedChar(path, (path,))

    def _end_value(self) -> None:
        """A value just ended: the next character separates, closes, or ends the root."""
        if not self._stack:
            self._state = _State.DONE
            return
        top = self._stack[-1]
        if not top.is_object:
            assert isinstance(top.key, int)
            top.key += 1
        self._state = _State.AFTER_VALUE


def _decode_key(raw: str) -> str:
    """A key's text with its JSON escapes decoded (invalid escapes kept as written)."""
    try:
        return json.loads(f'"{raw}"')
    except ValueError:
        return raw
