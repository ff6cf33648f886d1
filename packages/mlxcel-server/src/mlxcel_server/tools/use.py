"""A request's tool use: the functions offered, the choice among them, the convention."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mlxcel_server.errors import invalid
from mlxcel_server.schemas import NamedToolChoice, Tool
from mlxcel_server.tools.conventions import ToolCallFormat

ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | None

_ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class FunctionTool:
    """A function the model may call.

    Attributes:
        name: its name.
        description: what it does, or None.
        parameters: the JSON schema of its arguments (any object when none was given).
    """

    name: str
    description: str | None
    parameters: Mapping[str, Any]

    @classmethod
    def from_tool(cls, tool: Tool) -> FunctionTool:
        function = tool.function
        return cls(function.name, function.description, function.parameters or _ANY_OBJECT)

    def template_dict(self) -> dict[str, Any]:
        """The definition as chat templates read it (OpenAI's `tools` entry)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolUse:
    """How a request's replies are constrained and read for tool calls.

    Attributes:
        tool_format: the convention the replies use.
        tools: every function offered (the prompt shows them all).
        callable: the functions a reply may call: all of them, or the one `tool_choice`
            names.
        required: whether a reply must call (`required`, or a named function); else it
            may answer in text instead (`auto`).
        parallel: whether a reply may make several calls.
    """

    tool_format: ToolCallFormat
    tools: tuple[FunctionTool, ...]
    callable: tuple[FunctionTool, ...]
    required: bool
    parallel: bool


_PARALLEL_FORMATS = frozenset({ToolCallFormat.HERMES, ToolCallFormat.MISTRAL})


def make_tool_use(
    tools: Sequence[Tool] | None,
    tool_choice: ToolChoice,
    *,
    parallel: bool | None,
    tool_format: ToolCallFormat,
) -> ToolUse | None:
    """The request's tool use; None when no tools are offered or `tool_choice` is "none".

    Args:
        parallel: whether a reply may make several calls; None leaves it to the convention
            (yes where it writes several calls in one reply: Hermes, Mistral).

    Raises:
        ApiError: 400 naming `tool_choice` when it comes without tools or names a function
            that is not offered.
    """
    if not tools:
        if tool_choice not in (None, "none"):
            raise invalid("tool_choice needs tools", "tool_choice")
        return None
    if tool_choice == "none":
        return None
    offered = tuple(FunctionTool.from_tool(tool) for tool in tools)
    callable_ = offered
    if isinstance(tool_choice, NamedToolChoice):
        wanted = tool_choice.function.name
        callable_ = tuple(tool for tool in offered if tool.name == wanted)
        if not callable_:
            names = ", ".join(tool.name for tool in offered)
            raise invalid(
                f"tool_choice names the function {wanted!r}, which is not among the tools "
                f"({names})",
                "tool_choice",
            )
    required = tool_choice == "required" or isinstance(tool_choice, NamedToolChoice)
    if parallel is None:
        parallel = tool_format in _PARALLEL_FORMATS
    return ToolUse(tool_format, offered, callable_, required, parallel)


def make_call_id() -> str:
    """A fresh tool call id, as OpenAI writes them."""
    return f"call_{uuid.uuid4().hex[:24]}"
