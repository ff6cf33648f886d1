"""A request's input and its predecessor's conversation as chat messages, and the request as
the chat completion request that runs it."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcel_server.errors import invalid
from mlxcel_server.responses_api.objects import FunctionCallItem, OutputItem, OutputMessage
from mlxcel_server.responses_api.request import (
    FunctionCallInput,
    FunctionCallOutputInput,
    FunctionToolChoice,
    InputImage,
    InputMessage,
    ResponseRequest,
)
from mlxcel_server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    FunctionDefinition,
    ImageUrl,
    ImageUrlPart,
    NamedFunction,
    NamedToolChoice,
    TextPart,
    Tool,
    ToolCall,
)
from mlxcel_server.tools.use import ToolChoice

# The chat templates know no `developer` role; OpenAI treats it as the system's.
_TEMPLATE_ROLES = {"developer": "system"}


def _message(message: InputMessage) -> ChatMessage:
    role = _TEMPLATE_ROLES.get(message.role, message.role)
    if not message.image_urls() or isinstance(message.content, str):
        return ChatMessage(role=role, content=message.text())
    parts: list[ContentPart] = [
        ImageUrlPart(type="image_url", image_url=ImageUrl(url=part.image_url))
        if isinstance(part, InputImage)
        else TextPart(type="text", text=part.text)
        for part in message.content
    ]
    return ChatMessage(role=role, content=parts)


def _call(item: FunctionCallInput) -> ToolCall:
    return ToolCall(
        id=item.call_id,
        type="function",
        function=FunctionCall(name=item.name, arguments=item.arguments),
    )


def _with_call(messages: list[ChatMessage], call: ToolCall) -> None:
    """Add a call to the assistant turn it belongs to: the last message when that is the
    assistant's, else a new assistant message."""
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        calls = [*(last.tool_calls or ()), call]
        messages[-1] = last.model_copy(update={"tool_calls": calls})
        return
    messages.append(ChatMessage(role="assistant", tool_calls=[call]))


def input_messages(body: ResponseRequest) -> tuple[ChatMessage, ...]:
    """The request's `input` as chat messages: a string is one user message, function
    calls join the assistant turn before them, function call outputs are tool messages,
    and reasoning items are left out.

    Raises:
        ApiError: 400 naming `input` when it is an empty list.
    """
    if isinstance(body.input, str):
        return (ChatMessage(role="user", content=body.input),)
    if not body.input:
        raise invalid("input must hold at least one message", "input")
    messages: list[ChatMessage] = []
    for item in body.input:
        if isinstance(item, InputMessage):
            messages.append(_message(item))
        elif isinstance(item, FunctionCallInput):
            _with_call(messages, _call(item))
        elif isinstance(item, FunctionCallOutputInput):
            messages.append(
                ChatMessage(role="tool", tool_call_id=item.call_id, content=item.text())
            )
    return tuple(messages)


def make_chat(instructions: str | None, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The messages the chat template renders: `instructions` first, as a system message."""
    system = [] if instructions is None else [ChatMessage(role="system", content=instructions)]
    return system + list(messages)


def _tool_choice(body: ResponseRequest) -> ToolChoice:
    choice = body.tool_choice
    if isinstance(choice, FunctionToolChoice):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return choice


def chat_request(body: ResponseRequest, messages: Sequence[ChatMessage]) -> ChatCompletionRequest:
    """The chat completion request that runs the response: the conversation (previous turns
    included), its tools, token limit, sampling and format."""
    text_format = None if body.text is None else body.text.format
    tools = [
        Tool(
            type="function",
            function=FunctionDefinition(
                name=tool.name, description=tool.description, parameters=tool.parameters
            ),
        )
        for tool in body.tools or ()
    ]
    return ChatCompletionRequest(
        model=body.model,
        messages=make_chat(body.instructions, messages),
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        response_format=None if text_format is None else text_format.response_format(),
        tools=tools or None,
        tool_choice=_tool_choice(body),
        parallel_tool_calls=body.parallel_tool_calls,
    )


def reply_message(output: Sequence[OutputItem]) -> ChatMessage:
    """A response's output as the assistant turn a later response continues from: its
    message's text and its function calls (reasoning is left out, as templates drop it)."""
    text = "".join(
        part.text for item in output if isinstance(item, OutputMessage) for part in item.content
    )
    calls = [
        ToolCall(
            id=item.call_id,
            type="function",
            function=FunctionCall(name=item.name, arguments=item.arguments),
        )
        for item in output
        if isinstance(item, FunctionCallItem)
    ]
    return ChatMessage(
        role="assistant", content=text if text or not calls else None, tool_calls=calls or None
    )
