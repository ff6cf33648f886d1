"""The generic tool convention's prompt, for chat templates that teach no convention.

As llama-server's generic handler does, the tools' definitions go into the system message
with an instruction to reply with `{"tool_calls": [...]}` JSON or in plain text; the grammar
(`tools.grammar`) holds replies to that. Earlier turns are written the way the model is told
to write them: an assistant's calls as that JSON in its content, and the results as a user
message of `{"tool_response": ...}` objects, since such templates know no tool roles.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from mlxcel_server.schemas import ChatMessage
from mlxcel_server.tools.use import ToolUse

_FORMAT = '{"tool_calls": [{"name": "<function name>", "arguments": {<its arguments>}}]}'


def instruction(use: ToolUse) -> str:
    """The system message's paragraph describing the tools and how to call them."""
    definitions = "\n".join(
        json.dumps(tool.template_dict()["function"], ensure_ascii=False) for tool in use.tools
    )
    if len(use.callable) == 1 and use.required:
        how = f"Call the function {use.callable[0].name}: reply with only a JSON object {_FORMAT}."
    elif use.required:
        how = f"Call one or more of these functions: reply with only a JSON object {_FORMAT}."
    else:
        how = (
            "To call one or more of these functions, reply with only a JSON object "
            f"{_FORMAT}. Otherwise, answer the user in plain text."
        )
    return (
        "You can call the following functions (JSON schemas of their arguments):\n"
        f"{definitions}\n{how} The results of calls come back as tool_response objects."
    )


def _call_text(message: ChatMessage) -> str:
    calls = [
        {"name": call.function.name, "arguments": call.template_dict()["function"]["arguments"]}
        for call in message.tool_calls or ()
    ]
    text = json.dumps({"tool_calls": calls}, ensure_ascii=False)
    return f"{message.text()}\n{text}" if message.text() else text


def _results_message(results: Sequence[ChatMessage], names: dict[str, str]) -> ChatMessage:
    lines = [
        json.dumps(
            {
                "tool_response": {
                    "name": names.get(result.tool_call_id or "", ""),
                    "content": result.text(),
                }
            },
            ensure_ascii=False,
        )
        for result in results
    ]
    return ChatMessage(role="user", content="\n".join(lines))


def generic_messages(messages: Sequence[ChatMessage], use: ToolUse | None) -> list[ChatMessage]:
    """The conversation as a template without tool support renders it: tool calls and
    results as text, and, when tools are offered, their instruction in the system message
    (a new first message when there is none)."""
    names = {
        call.id: call.function.name for message in messages for call in message.tool_calls or ()
    }
    converted: list[ChatMessage] = []
    results: list[ChatMessage] = []
    for message in messages:
        if message.role == "tool":
            results.append(message)
            continue
        if results:
            converted.append(_results_message(results, names))
            results = []
        if message.tool_calls:
            message = ChatMessage(
                role="assistant",
                content=_call_text(message),
                reasoning_content=message.reasoning_content,
            )
        converted.append(message)
    if results:
        converted.append(_results_message(results, names))
    if use is None:
        return converted
    paragraph = instruction(use)
    if converted and converted[0].role in ("system", "developer"):
        first = converted[0]
        text = f"{first.text()}\n\n{paragraph}" if first.text() else paragraph
        return [ChatMessage(role=first.role, content=text), *converted[1:]]
    return [ChatMessage(role="system", content=paragraph), *converted]
