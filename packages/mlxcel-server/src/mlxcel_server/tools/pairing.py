"""Tool results must answer calls: the rule OpenAI's and Anthropic's APIs enforce on a
conversation, checked once on the chat messages every chat API converts its input to.

Each run of tool results (`tool` messages) follows, at once, the assistant message that made
the calls, and answers one of its calls; every call of an assistant message is answered
before the conversation goes on. OpenAI's chat completions and Responses API and
Anthropic's Messages API each answer a conversation breaking this with a 400: a result
with no call before it, a result whose id matches none of the calls before it, and a call
left without its result. The message speaks each API's words (`tool_call_id`, `call_id`,
`tool_use_id`), naming the ids at fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_server.errors import invalid
from mlxcel_server.schemas import ChatMessage


@dataclass(frozen=True)
class ToolTerms:
    """An API's words for tool calls and their results, used in its error messages.

    Attributes:
        call: what a call is called (`tool_calls` entry, `function_call`, `tool_use`).
        result: what a result is called (`tool` message, `function_call_output`,
            `tool_result`).
        result_id: the result's field naming its call.
    """

    call: str
    result: str
    result_id: str


CHAT_TERMS = ToolTerms("tool call", "tool message", "tool_call_id")
RESPONSES_TERMS = ToolTerms("function_call", "function_call_output", "call_id")
ANTHROPIC_TERMS = ToolTerms("tool_use", "tool_result", "tool_use_id")


def _names(ids: Sequence[str]) -> str:
    return ", ".join(repr(call_id) for call_id in ids)


def check_tool_results(
    messages: Sequence[ChatMessage], terms: ToolTerms, param: str | None = None
) -> None:
    """Check that every tool result answers a call of the assistant message right before its
    run of results, and that every call is answered.

    Args:
        messages: the conversation as chat messages.
        terms: the API's words for calls and results.
        param: the request field named in errors; None names each chat message
            (`messages[i]`).

    Raises:
        ApiError: 400 naming the first result without a matching call, or the calls left
            unanswered.
    """
    open_calls: list[str] = []
    caller: int | None = None
    for index, message in enumerate(messages):
        where = param or f"messages[{index}]"
        if message.role == "tool":
            call_id = message.tool_call_id or ""
            if caller is None:
                raise invalid(
                    f"{where}: the {terms.result} with {terms.result_id} {call_id!r} follows "
                    f"no {terms.call}; a {terms.result} must come right after the assistant "
                    f"turn whose {terms.call} it answers",
                    where,
                )
            calls = [call.id for call in messages[caller].tool_calls or ()]
            if call_id not in calls:
                raise invalid(
                    f"{where}: the {terms.result} with {terms.result_id} {call_id!r} answers "
                    f"none of the {terms.call} ids of the assistant turn before it "
                    f"({_names(calls)})",
                    where,
                )
            if call_id in open_calls:
                open_calls.remove(call_id)
            continue
        _check_answered(open_calls, caller, terms, param)
        caller = index if message.role == "assistant" and message.tool_calls else None
        open_calls = [call.id for call in message.tool_calls or ()]
    _check_answered(open_calls, caller, terms, param)


def _check_answered(
    open_calls: Sequence[str], caller: int | None, terms: ToolTerms, param: str | None
) -> None:
    if open_calls:
        where = param or f"messages[{caller}]"
        raise invalid(
            f"{where}: {terms.call} ids without a {terms.result} right after them: "
            f"{_names(open_calls)}; each {terms.call} needs its {terms.result} in the next turn",
            where,
        )
