"""An Anthropic request as the chat completion request that runs it.

Anthropic's blocks map onto OpenAI-style chat messages, which is what chat templates read:
`system` becomes the first message, an assistant's `tool_use` blocks its `tool_calls`, and
each `tool_result` block a `tool` message. Earlier replies' thinking blocks are left out of
the prompt, as Anthropic's own models drop earlier turns' reasoning.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from mlxcel_server.anthropic_api.request import (
    AnyToolChoice,
    AutoToolChoice,
    ContentBlock,
    ImageBlock,
    Message,
    MessagesRequest,
    NamedToolChoice,
    NoToolChoice,
    PromptFields,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from mlxcel_server.errors import invalid
from mlxcel_server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    FunctionDefinition,
    ImageUrl,
    ImageUrlPart,
    NamedFunction,
    TextPart,
    Tool,
    ToolCall,
)
from mlxcel_server.schemas import NamedToolChoice as ChatNamedToolChoice
from mlxcel_server.tools.use import ToolChoice

# Where a failed call's result is marked for the model: chat templates know no error flag.
ERROR_RESULT_PREFIX = "Error: "


def _no_images(blocks: Sequence[object], param: str) -> None:
    for index, block in enumerate(blocks):
        if isinstance(block, ImageBlock):
            raise invalid(
                f"{param}[{index}]: image blocks are taken only in a user message's own content",
                f"{param}[{index}]",
            )


def _result_text(block: ToolResultBlock, param: str) -> str:
    if isinstance(block.content, str):
        text = block.content
    else:
        _no_images(block.content, f"{param}.content")
        text = "\n".join(part.text for part in block.content if isinstance(part, TextBlock))
    return ERROR_RESULT_PREFIX + text if block.is_error else text


def _texts(blocks: Sequence[ContentBlock]) -> str:
    return "\n".join(block.text for block in blocks if isinstance(block, TextBlock))


def _only(blocks: Sequence[ContentBlock], role: str, allowed: tuple[type, ...], param: str) -> None:
    for index, block in enumerate(blocks):
        if not isinstance(block, allowed):
            raise invalid(
                f"{param}[{index}]: a {role} message may not hold {block.type} blocks",
                f"{param}[{index}]",
            )


def _image_url(block: ImageBlock, param: str) -> ImageUrlPart:
    """An image block's source as a chat `image_url` part: base64 data as a data URL."""
    source = block.source
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str):
        media_type = source.get("media_type")
        if not isinstance(media_type, str):
            raise invalid(f"{param}.source: a base64 source needs media_type", f"{param}.source")
        url = f"data:{media_type};base64,{source['data']}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise invalid(
            f"{param}.source: expected a base64 source (type, media_type, data) or a url "
            "source (type, url)",
            f"{param}.source",
        )
    return ImageUrlPart(type="image_url", image_url=ImageUrl(url=url))


def _user_content(blocks: Sequence[ContentBlock], param: str) -> str | list[ContentPart]:
    """The text and image blocks as a user message's content (text alone joined)."""
    if not any(isinstance(block, ImageBlock) for block in blocks):
        return _texts(blocks)
    return [
        _image_url(block, f"{param}[{index}]")
        if isinstance(block, ImageBlock)
        else TextPart(type="text", text=block.text)
        for index, block in enumerate(blocks)
        if isinstance(block, ImageBlock | TextBlock)
    ]


def _user_messages(blocks: Sequence[ContentBlock], param: str) -> list[ChatMessage]:
    _only(blocks, "user", (TextBlock, ImageBlock, ToolResultBlock), param)
    results = [
        ChatMessage(
            role="tool",
            tool_call_id=block.tool_use_id,
            content=_result_text(block, f"{param}[{index}]"),
        )
        for index, block in enumerate(blocks)
        if isinstance(block, ToolResultBlock)
    ]
    has_parts = any(isinstance(block, TextBlock | ImageBlock) for block in blocks)
    user = [ChatMessage(role="user", content=_user_content(blocks, param))] if has_parts else []
    return results + user


def _assistant_message(blocks: Sequence[ContentBlock], param: str) -> ChatMessage:
    _no_images(blocks, param)
    allowed = (TextBlock, ToolUseBlock, ThinkingBlock, RedactedThinkingBlock)
    _only(blocks, "assistant", allowed, param)
    calls = [
        ToolCall(
            id=block.id,
            type="function",
            function=FunctionCall(name=block.name, arguments=json.dumps(block.input)),
        )
        for block in blocks
        if isinstance(block, ToolUseBlock)
    ]
    return ChatMessage(role="assistant", content=_texts(blocks), tool_calls=calls or None)


def _chat_messages(index: int, message: Message) -> list[ChatMessage]:
    if isinstance(message.content, str):
        return [ChatMessage(role=message.role, content=message.content)]
    param = f"messages[{index}].content"
    if message.role == "user":
        return _user_messages(message.content, param)
    return [_assistant_message(message.content, param)]


def chat_messages(body: PromptFields) -> list[ChatMessage]:
    """The conversation as chat messages, `system` first.

    Raises:
        ApiError: 400 naming the message at fault: no messages, a last message that is not
            the user's (continuing an assistant turn is not supported), an image block outside
            a user message's own content or with an unknown source, or a tool block in the
            wrong role.
    """
    if not body.messages:
        raise invalid("messages must hold at least one message", "messages")
    if body.messages[-1].role != "user":
        raise invalid(
            "the last message must be the user's: continuing a partial assistant turn "
            "(prefill) is not supported",
            f"messages[{len(body.messages) - 1}]",
        )
    system = body.system_text()
    messages = [] if system is None else [ChatMessage(role="system", content=system)]
    for index, message in enumerate(body.messages):
        messages += _chat_messages(index, message)
    return messages


def _chat_tools(body: PromptFields) -> list[Tool] | None:
    if body.tools is None:
        return None
    return [
        Tool(
            type="function",
            function=FunctionDefinition(
                name=tool.name, description=tool.description, parameters=tool.input_schema
            ),
        )
        for tool in body.tools
    ]


def _chat_tool_choice(body: PromptFields) -> ToolChoice:
    """Anthropic's choice as chat's: `any` is "required", `tool` a named function."""
    choice = body.tool_choice
    if choice is None:
        return None
    if isinstance(choice, NoToolChoice):
        return "none"
    if isinstance(choice, AnyToolChoice):
        return "required"
    if isinstance(choice, NamedToolChoice):
        return ChatNamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return "auto"


def chat_request(body: PromptFields) -> ChatCompletionRequest:
    """The chat completion request rendering the same prompt: messages, tools, tool choice.

    Raises:
        ApiError: 400 naming the field at fault (see `chat_messages`).
    """
    choice = body.tool_choice
    parallel = None
    if isinstance(choice, AutoToolChoice | AnyToolChoice | NamedToolChoice):
        parallel = False if choice.disable_parallel_tool_use else None
    return ChatCompletionRequest(
        model=body.model,
        messages=chat_messages(body),
        tools=_chat_tools(body),
        tool_choice=_chat_tool_choice(body),
        parallel_tool_calls=parallel,
    )


def generation_request(body: MessagesRequest) -> ChatCompletionRequest:
    """`chat_request` with the request's token limit, stop sequences and sampling.

    Raises:
        ApiError: as `chat_request`.
    """
    return chat_request(body).model_copy(
        update={
            "max_tokens": body.max_tokens,
            "stop": body.stop_sequences,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
        }
    )
