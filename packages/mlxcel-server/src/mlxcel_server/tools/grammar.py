"""The grammar a reply with tools follows, in llguidance's Lark syntax.

Every reply with tools is constrained, `auto` included, so that it always parses: it is either
an answer (free text, or the `response_format` schema's JSON) or calls in the convention's
markup, each call's arguments following its function's `parameters` schema. `required` and a
named function leave out the answer. As llama-server's grammars for tool calls do, text before
a Hermes call is free until the opening marker, which llguidance matches lazily (the shortest
text ending in it), so the call's JSON is enforced from there on.

Call JSON is written as chat templates render it (`json.dumps`' separators, no other
whitespace), with the name first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server.tools.conventions import (
    HERMES_CLOSE,
    HERMES_OPEN,
    LAYOUTS,
    MISTRAL_MARKER,
    ToolCallFormat,
)
from mlxcel_server.tools.use import FunctionTool, ToolUse

_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_TEXT = "TEXT: /(.|\\n)*/"
# A text answer where a call is the reply's JSON: anything not starting with `{`.
_TEXT_NOT_JSON = "TEXT: /[^{](.|\\n)*/"
_REF_PREFIXES = ("#/$defs/", "#/definitions/")


def _embedded(schema: Any, prefix: str, definitions: dict[str, Any]) -> Any:
    """`schema` with its definitions moved into `definitions` under `prefix`, and its
    references rewritten to match, so that it can sit inside a larger schema."""
    if isinstance(schema, list):
        return [_embedded(item, prefix, definitions) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    result: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("$defs", "definitions") and isinstance(value, Mapping):
            for name, definition in value.items():
                definitions[prefix + name] = _embedded(definition, prefix, definitions)
        elif key == "$ref" and isinstance(value, str):
            result[key] = _local_ref(value, prefix)
        else:
            result[key] = _embedded(value, prefix, definitions)
    return result


def _local_ref(ref: str, prefix: str) -> str:
    for start in _REF_PREFIXES:
        if ref.startswith(start):
            return "#/$defs/" + prefix + ref[len(start) :]
    return ref


def _call_schema(tool: FunctionTool, arguments_key: str, definitions: dict[str, Any]) -> dict:
    parameters = _embedded(tool.parameters, f"{tool.name}__", definitions)
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _calls_schema(tools: Sequence[FunctionTool], arguments_key: str, definitions: dict) -> dict:
    schemas = [_call_schema(tool, arguments_key, definitions) for tool in tools]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _json_rule(schema: Mapping[str, Any], definitions: Mapping[str, Any]) -> str:
    full = {"x-guidance": _JSON_STYLE, **schema}
    if definitions:
        full["$defs"] = dict(definitions)
    return "%json " + json.dumps(full, ensure_ascii=False)


def _special_token_id(tokenizer: Tokenizer, marker: str) -> int | None:
    """The id of the special token written `marker`, or None when it is plain text."""
    for token_id, token in tokenizer.hf_tokenizer.added_tokens_decoder.items():
        if token.content == marker and token.special:
            return token_id
    return None


def marker_is_special(tool_format: ToolCallFormat, tokenizer: Tokenizer) -> bool:
    """Whether the convention's opening marker is a special token, which the detokenizer
    must then keep in the text for the reply to be read."""
    opening = LAYOUTS[tool_format].opening
    return bool(opening) and _special_token_id(tokenizer, opening) is not None


def _array(item: Mapping[str, Any], parallel: bool) -> dict:
    array: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
    if not parallel:
        array["maxItems"] = 1
    return array


def make_tool_grammar(
    use: ToolUse, tokenizer: Tokenizer, answer_schema: Mapping[str, Any] | None = None
) -> str:
    """The Lark grammar (llguidance syntax) the replies of `use` follow.

    Args:
        use: the request's tool use.
        tokenizer: the model's tokenizer (a marker that is a special token is matched as
            that token).
        answer_schema: the JSON schema a non-call answer follows (`response_format`), or
            None for free text.

    Returns:
        The grammar text; compile it with `structured.compile_grammar`.
    """
    layout = LAYOUTS[use.tool_format]
    definitions: dict[str, Any] = {}
    key = layout.arguments_keys[0]
    calls = _calls_schema(use.callable, key, definitions)
    lines: list[str] = []
    if use.tool_format is ToolCallFormat.GENERIC:
        wrapper = {
            "type": "object",
            "properties": {"tool_calls": _array(calls, use.parallel)},
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
        if use.required:
            return f"start: calls\ncalls: {_json_rule(wrapper, definitions)}\n"
        if answer_schema is not None:
            either = {"anyOf": [wrapper, dict(answer_schema)]}
            return f"start: reply\nreply: {_json_rule(either, definitions)}\n"
        return f"start: TEXT | calls\n{_TEXT_NOT_JSON}\ncalls: {_json_rule(wrapper, definitions)}\n"
    if use.tool_format is ToolCallFormat.LLAMA3_JSON:
        lines.append(f"call: {_json_rule(calls, definitions)}")
        forced, lead = "call", None
        text = _TEXT_NOT_JSON
    elif use.tool_format is ToolCallFormat.HERMES:
        opening = json.dumps(HERMES_OPEN + "\n")
        closing = json.dumps("\n" + HERMES_CLOSE)
        lines += [
            f"call: {opening} body",
            f"body: {_json_rule(calls, definitions)} {closing}",
            f"lead[lazy]: TEXT {json.dumps(HERMES_OPEN)}",
        ]
        more = ' ("\\n" call)*' if use.parallel else ""
        forced = f"call{more}"
        lead = f'lead "\\n" body{more}'
        text = _TEXT
    else:
        special = _special_token_id(tokenizer, MISTRAL_MARKER)
        marker = f"<[{special}]>" if special is not None else json.dumps(MISTRAL_MARKER)
        lines.append(f"calls: {marker} {_json_rule(_array(calls, use.parallel), definitions)}")
        forced = "calls"
        lead = "TEXT calls" if special is not None else None
        text = _TEXT
    if use.required:
        start = forced
    elif answer_schema is not None:
        lines.append(f"answer: {_json_rule(answer_schema, {})}")
        start = f"answer | {forced}"
    else:
        lines.append(text)
        start = "TEXT | " + (lead or forced)
    return "\n".join([f"start: {start}", *lines]) + "\n"
