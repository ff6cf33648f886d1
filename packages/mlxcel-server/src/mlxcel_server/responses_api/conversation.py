"""A request's input and its predecessor's conversation as chat messages for the template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlxcel_server.errors import invalid
from mlxcel_server.responses_api.request import InputMessage, ResponseRequest

# The chat templates know no `developer` role; OpenAI treats it as the system's.
_TEMPLATE_ROLES = {"developer": "system"}


@dataclass(frozen=True)
class ChatTurn:
    """One message of a conversation, as the chat template takes it.

    Attributes:
        role: `system`, `user` or `assistant`.
        content: the message's text.
    """

    role: Literal["system", "user", "assistant"]
    content: str


def input_turns(body: ResponseRequest) -> tuple[ChatTurn, ...]:
    """The request's `input` as chat turns; a string is one user message, reasoning items
    are left out.

    Raises:
        ApiError: 400 naming `input` when it is an empty list.
    """
    if isinstance(body.input, str):
        return (ChatTurn("user", body.input),)
    if not body.input:
        raise invalid("input must hold at least one message", "input")
    return tuple(
        ChatTurn(_TEMPLATE_ROLES.get(m.role, m.role), m.text())
        for m in body.input
        if isinstance(m, InputMessage)
    )


def make_chat(instructions: str | None, turns: tuple[ChatTurn, ...]) -> list[dict[str, str]]:
    """The messages the chat template renders: `instructions` first, as a system message."""
    system = [] if instructions is None else [{"role": "system", "content": instructions}]
    return system + [{"role": turn.role, "content": turn.content} for turn in turns]
