"""A request's input and its predecessor's conversation as chat messages for the template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlxcel_server.errors import invalid
from mlxcel_server.responses_api.request import InputImage, InputMessage, ResponseRequest
from mlxcel_server.schemas import ChatMessage, ContentPart, ImageUrl, ImageUrlPart, TextPart

# The chat templates know no `developer` role; OpenAI treats it as the system's.
_TEMPLATE_ROLES = {"developer": "system"}


@dataclass(frozen=True)
class ChatTurn:
    """One message of a conversation, as the chat template takes it.

    Attributes:
        role: `system`, `user` or `assistant`.
        content: the message's text.
        parts: a user message's text and `input_image` parts in order, when it holds
            images (they are read again for each later turn); else empty.
    """

    role: Literal["system", "user", "assistant"]
    content: str
    parts: tuple[ContentPart, ...] = ()

    def chat_message(self) -> ChatMessage:
        """The turn as a chat message for the template."""
        return ChatMessage(role=self.role, content=list(self.parts) or self.content)


def _turn(message: InputMessage) -> ChatTurn:
    role = _TEMPLATE_ROLES.get(message.role, message.role)
    if not message.image_urls() or isinstance(message.content, str):
        return ChatTurn(role, message.text())
    parts: tuple[ContentPart, ...] = tuple(
        ImageUrlPart(type="image_url", image_url=ImageUrl(url=part.image_url))
        if isinstance(part, InputImage)
        else TextPart(type="text", text=part.text)
        for part in message.content
    )
    return ChatTurn(role, message.text(), parts)


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
    return tuple(_turn(m) for m in body.input if isinstance(m, InputMessage))


def make_chat(instructions: str | None, turns: tuple[ChatTurn, ...]) -> list[ChatMessage]:
    """The messages the chat template renders: `instructions` first, as a system message."""
    system = [] if instructions is None else [ChatMessage(role="system", content=instructions)]
    return system + [turn.chat_message() for turn in turns]
