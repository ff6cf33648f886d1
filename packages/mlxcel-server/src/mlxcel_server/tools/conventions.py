"""The conventions models write tool calls in, and which one a chat template teaches.

- Hermes (Qwen 2.5/3, Hermes 2/3): each call is `<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>`; a reply may hold several, after some text.
- Llama 3.1+: the whole reply is one JSON object `{"name": ..., "parameters": {...}}`.
- Mistral (v0.3, Nemo): `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}` objects.
- Generic, for templates that teach none (as llama-server's generic handler): the tools'
  schemas go into the system message with an instruction, and a call is the whole reply as
  `{"tool_calls": [{"name": ..., "arguments": {...}}]}`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mlxcel_server.tools.json_scan import Path

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_MARKER = "[TOOL_CALLS]"
# Newer Mistral templates write `[TOOL_CALLS]name[ARGS]{...}`, which is not read here.
_MISTRAL_NAMED_ARGUMENTS = "[ARGS]"


class ToolCallFormat(enum.Enum):
    """A convention for writing tool calls."""

    GENERIC = "generic"
    HERMES = "hermes"
    LLAMA3_JSON = "llama3_json"
    MISTRAL = "mistral"


@dataclass(frozen=True)
class CallLayout:
    """Where the calls sit in a convention's JSON.

    Attributes:
        call_path: the path of a call object in the JSON after the opening marker; an
            `int` entry stands for any array index.
        arguments_keys: the keys a call's arguments may come under, the usual one first.
        opening: the marker before the JSON ("" when the reply is the JSON itself).
        closing: the marker after it ("" for none).
    """

    call_path: tuple[str | type[int], ...]
    arguments_keys: tuple[str, ...]
    opening: str
    closing: str

    def is_call(self, path: Path) -> bool:
        """Whether `path` is where a call object sits."""
        return len(path) == len(self.call_path) and all(
            isinstance(step, int) if pattern is int else step == pattern
            for step, pattern in zip(path, self.call_path, strict=True)
        )


LAYOUTS = {
    ToolCallFormat.GENERIC: CallLayout(("tool_calls", int), ("arguments",), "", ""),
    ToolCallFormat.HERMES: CallLayout((), ("arguments",), HERMES_OPEN, HERMES_CLOSE),
    ToolCallFormat.LLAMA3_JSON: CallLayout((), ("parameters", "arguments"), "", ""),
    ToolCallFormat.MISTRAL: CallLayout((int,), ("arguments",), MISTRAL_MARKER, ""),
}


def detect_format(chat_template: str | None) -> ToolCallFormat:
    """The tool-call convention a chat template teaches; `GENERIC` when it teaches none
    mlxcel reads."""
    if chat_template is None:
        return ToolCallFormat.GENERIC
    if HERMES_OPEN in chat_template:
        return ToolCallFormat.HERMES
    if PYTHON_TAG in chat_template or "ipython" in chat_template:
        return ToolCallFormat.LLAMA3_JSON
    if MISTRAL_MARKER in chat_template and _MISTRAL_NAMED_ARGUMENTS not in chat_template:
        return ToolCallFormat.MISTRAL
    return ToolCallFormat.GENERIC
