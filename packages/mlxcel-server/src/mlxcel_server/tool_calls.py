"""Reading tool calls out of a model's reply, in the convention its chat template teaches.

Two conventions are understood:

- Hermes (Qwen 2.5/3, Hermes 2/3): each call is `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>`; a reply may hold several, with text around them.
- Llama 3.1+: the whole reply is one JSON object `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`.

A reply whose markup does not parse is plain text: its tool calls are dropped, never guessed.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass

_HERMES_OPEN = "<tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


class ToolCallFormat(enum.Enum):
    """A model's convention for writing tool calls."""

    HERMES = "hermes"
    LLAMA3_JSON = "llama3_json"


@dataclass(frozen=True)
class ParsedToolCall:
    """One tool call.

    Attributes:
        name: the function's name.
        arguments: its arguments as JSON text (an object).
    """

    name: str
    arguments: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into text and tool calls.

    Attributes:
        content: the text outside tool markup (stripped when there are calls; the whole
            reply, as written, when there are none); None when there is none.
        tool_calls: the calls, in the order written.
    """

    content: str | None
    tool_calls: tuple[ParsedToolCall, ...] = ()


def detect_format(chat_template: str | None) -> ToolCallFormat | None:
    """The tool-call convention a chat template teaches, or None when it teaches neither."""
    if chat_template is None:
        return None
    if _HERMES_OPEN in chat_template:
        return ToolCallFormat.HERMES
    if _PYTHON_TAG in chat_template or "ipython" in chat_template:
        return ToolCallFormat.LLAMA3_JSON
    return None


def _plain(text: str) -> ParsedReply:
    return ParsedReply(content=text or None)


def _make_call(data: object, arguments_key: str) -> ParsedToolCall | None:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    arguments = data.get(arguments_key, {})
    if isinstance(arguments, str):
        # Some models write the arguments as JSON text rather than an object.
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedToolCall(data["name"], json.dumps(arguments, ensure_ascii=False))


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def parse_hermes(text: str) -> ParsedReply:
    """Split a Hermes-style reply; an unclosed last `<tool_call>` runs to the end."""
    calls = []
    for match in _HERMES_CALL.finditer(text):
        call = _make_call(_loads(match.group(1).strip()), "arguments")
        if call is None:
            return _plain(text)
        calls.append(call)
    if not calls:
        return _plain(text)
    content = _HERMES_CALL.sub("", text).strip() or None
    return ParsedReply(content=content, tool_calls=tuple(calls))


def parse_llama3_json(text: str) -> ParsedReply:
    """Read a Llama-3 reply that is one JSON call (`parameters`, or `arguments`)."""
    body = text.strip().removeprefix(_PYTHON_TAG).strip()
    data = _loads(body)
    key = "parameters" if isinstance(data, dict) and "parameters" in data else "arguments"
    call = _make_call(data, key)
    return _plain(text) if call is None else ParsedReply(content=None, tool_calls=(call,))


def parse_tool_calls(text: str, tool_format: ToolCallFormat) -> ParsedReply:
    """Split a whole reply into its text and the tool calls written in `tool_format`."""
    if tool_format is ToolCallFormat.HERMES:
        return parse_hermes(text)
    return parse_llama3_json(text)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def content_end(text: str, tool_format: ToolCallFormat) -> int:
    """How much of a reply so far is certainly text: everything before tool markup begins
    or might begin (a partial marker at the end is held back)."""
    if tool_format is ToolCallFormat.HERMES:
        start = text.find(_HERMES_OPEN)
        return start if start >= 0 else len(text) - _partial_suffix(text, _HERMES_OPEN)
    head = text.lstrip()
    undecided = not head or head.startswith("{") or _PYTHON_TAG.startswith(head[: len(_PYTHON_TAG)])
    return 0 if undecided else len(text)


class ToolCallStream:
    """Splits a streamed reply: text to send as it comes, tool markup held for the end."""

    def __init__(self, tool_format: ToolCallFormat) -> None:
        self._format = tool_format
        self._text = ""
        self._sent = 0

    def feed(self, text: str) -> str:
        """Add newly generated text; returns the text that can be sent now."""
        self._text += text
        end = max(self._sent, content_end(self._text, self._format))
        ready = self._text[self._sent : end]
        self._sent = end
        return ready

    def finish(self) -> ParsedReply:
        """Parse what was held back once the reply is complete."""
        return parse_tool_calls(self._text[self._sent :], self._format)
