"""One chat prompt builder for every chat API: chat completions, the Responses API and
Anthropic's Messages API each express their request as a `ChatCompletionRequest` and build
its prompt here.

The steps, in order: the tool use and its convention (`tools`), the conversation as the
template renders it (the generic convention writes tools and calls as text), the reasoning
syntax and template variables, the token ids (off the event loop, images included), the
context check, how replies are read for reasoning, and the grammar replies follow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlxcel_core.images import PromptImage
from mlxcel_models.image_prompt import ImagePrompt
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_models.tokenizer.reasoning import find_reasoning_syntax
from mlxcel_server import generation
from mlxcel_server.errors import invalid
from mlxcel_server.image_prompts import ImageDecoder, ImageReference, encode_image_chat
from mlxcel_server.reasoning import ReasoningFormat, ReasoningPlan, make_plan, template_kwargs
from mlxcel_server.schemas import ChatCompletionRequest, ChatMessage, ImageUrlPart
from mlxcel_server.state import ServingModel
from mlxcel_server.structured import (
    Grammar,
    answer_constraint,
    lark_grammar,
    request_grammar,
    schema_problem,
)
from mlxcel_server.tools.conventions import ToolCallFormat, detect_format
from mlxcel_server.tools.generic import generic_messages
from mlxcel_server.tools.grammar import make_tool_grammar, marker_is_special
from mlxcel_server.tools.pairing import CHAT_TERMS, ToolTerms, check_tool_results
from mlxcel_server.tools.use import ToolUse, make_tool_use


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request's prompt and how its replies are generated and read.

    Attributes:
        ids: the prompt's token ids.
        images: its images (placeholder runs in `ids`).
        tool_use: how replies are read for tool calls; None without tools.
        reasoning: how replies are read for reasoning; None for plain text.
        grammar: the grammar replies follow (tool calls, `response_format`), or None.
        keep_special_tokens: whether the replies' special tokens stay in their text (a
            tool convention's marker that is one).
    """

    ids: list[int]
    images: tuple[PromptImage, ...]
    tool_use: ToolUse | None
    reasoning: ReasoningPlan | None
    grammar: Grammar | None
    keep_special_tokens: bool = False


def image_references(
    messages: Sequence[ChatMessage], param: str | None = None
) -> list[ImageReference]:
    """The conversation's images in order, each named by its field
    (`messages[i].content[j].image_url`), or all by `param` when given."""
    return [
        ImageReference(
            part.image_url.url, param or f"messages[{index}].content[{position}].image_url"
        )
        for index, message in enumerate(messages)
        if isinstance(message.content, list)
        for position, part in enumerate(message.content)
        if isinstance(part, ImageUrlPart)
    ]


async def encode_messages(
    model: ServingModel,
    messages: Sequence[ChatMessage],
    *,
    image_decoder: ImageDecoder | None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    param: str | None = None,
) -> ImagePrompt:
    """The conversation's prompt through the model's chat template (off the event loop):
    its token ids and, when messages hold images, their placeholder runs.

    Args:
        image_decoder: reads the messages' images; None when the server reads none.
        tools: function definitions the template renders, or None for none.
        template_kwargs: extra template variables (`enable_thinking`), or None.
        param: the request field errors name, when the messages were converted from
            another API's input (else `messages`, and each image's own part).

    Raises:
        ApiError: 400 for no messages, when the template rejects the conversation, or for
            an image that cannot be used or a model without vision support (see
            `encode_image_chat`).
    """
    if not messages:
        raise invalid("messages must hold at least one message", param or "messages")
    conversation = [m.template_dict() for m in messages]
    references = image_references(messages, param)
    if references:
        return await encode_image_chat(
            model,
            conversation,
            references,
            image_decoder,
            tools=tools,
            template_kwargs=template_kwargs,
            param=param or "messages",
        )
    try:
        ids = await asyncio.to_thread(
            model.loaded.tokenizer.encode_chat,
            conversation,
            tools=tools,
            template_kwargs=template_kwargs,
        )
    except ValueError as error:
        raise invalid(str(error), param or "messages") from error
    return ImagePrompt(tuple(ids), ())


def template_messages(
    messages: Sequence[ChatMessage], tool_format: ToolCallFormat, tool_use: ToolUse | None
) -> list[ChatMessage]:
    """The conversation as the chat template takes it: as sent where the template teaches
    a tool convention, else with tools and calls written as the generic convention's text."""
    if tool_format is ToolCallFormat.GENERIC:
        return generic_messages(messages, tool_use)
    return list(messages)


def _grammar(
    chat: ChatCompletionRequest, tool_use: ToolUse | None, tokenizer: Tokenizer, format_param: str
) -> Grammar | None:
    """The grammar replies follow: the tools' (holding each function's schema, and the
    answer's schema) or the request's own.

    Raises:
        ApiError: 400 for `grammar` with tools (as llama-server), or a schema llguidance
            cannot enforce, named with its function, in one line.
    """
    if tool_use is None:
        return request_grammar(chat, format_param)
    if chat.grammar is not None:
        raise invalid("grammar cannot be combined with tools; leave one out", "grammar")
    for tool in tool_use.tools:
        problem = schema_problem(dict(tool.parameters))
        if problem is not None:
            raise invalid(
                f"tools: the parameters schema of function {tool.name!r} cannot be enforced: "
                f"{problem}",
                "tools",
            )
    schema, param = answer_constraint(chat, format_param)
    if schema is not None and (problem := schema_problem(schema)) is not None:
        raise invalid(f"{param}: the schema cannot be enforced: {problem}", param)
    return lark_grammar(make_tool_grammar(tool_use, tokenizer, schema), "tools")


async def build_chat_prompt(
    model: ServingModel,
    chat: ChatCompletionRequest,
    *,
    image_decoder: ImageDecoder | None,
    reasoning_format: ReasoningFormat,
    reasoning_budget: int,
    param: str | None = None,
    format_param: str = "response_format",
    tool_terms: ToolTerms = CHAT_TERMS,
    check: bool = True,
) -> ChatPrompt:
    """The prompt of a chat request, and how its replies are constrained and read.

    Args:
        image_decoder: reads the messages' images; None when the server reads none.
        reasoning_format: the request's reasoning format.
        reasoning_budget: -1 for no limit, else the most reasoning tokens per reply.
        param: the request field the messages came from, named in errors, when they were
            converted from another API's input (else `messages`, and each image's part).
        format_param: the field `response_format` came from, named in errors.
        tool_terms: the API's words for tool calls and results, in errors.
        check: refuse a prompt that is empty or does not fit the context (counting
            tokens does not).

    Raises:
        ApiError: 400 naming the field at fault: `tool_choice` (see `make_tool_use`), a
            tool result without its call or a call without its result (see
            `check_tool_results`), the messages (see `encode_messages`), a prompt too
            long, a tool's schema llguidance cannot enforce, or conflicting constraints (see
            `answer_constraint`). Another grammar llguidance cannot enforce is refused
            where it is compiled, in `generation.prepare`.
    """
    check_tool_results(chat.messages, tool_terms, param)
    tokenizer = model.loaded.tokenizer
    tool_format = detect_format(tokenizer.chat_template)
    tool_use = make_tool_use(
        chat.tools, chat.tool_choice, parallel=chat.parallel_tool_calls, tool_format=tool_format
    )
    grammar = _grammar(chat, tool_use, tokenizer, format_param)
    native_tools = tool_use is not None and tool_format is not ToolCallFormat.GENERIC
    syntax = find_reasoning_syntax(tokenizer)
    prompt = await encode_messages(
        model,
        template_messages(chat.messages, tool_format, tool_use),
        image_decoder=image_decoder,
        tools=[tool.template_dict() for tool in tool_use.tools] if native_tools else None,
        template_kwargs=template_kwargs(chat.chat_template_kwargs, syntax, reasoning_budget),
        param=param,
    )
    ids = list(prompt.prompt_ids)
    if check:
        generation.check_prompt(ids, model.context_size, param or "messages")
    return ChatPrompt(
        ids=ids,
        images=prompt.images,
        tool_use=tool_use,
        reasoning=make_plan(syntax, reasoning_format, reasoning_budget, tokenizer, ids),
        grammar=grammar,
        keep_special_tokens=tool_use is not None and marker_is_special(tool_format, tokenizer),
    )
