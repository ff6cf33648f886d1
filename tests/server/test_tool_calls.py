"""Reading tool calls out of replies: the Hermes and Llama-3 parsers and the stream splitter."""

import json

import pytest

from mlxcel_server.schemas import ToolCall
from mlxcel_server.tool_calls import (
    ParsedReply,
    ParsedToolCall,
    ToolCallFormat,
    ToolCallStream,
    detect_format,
    parse_hermes,
    parse_llama3_json,
)

PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TOKYO = '{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "°C"}}'


def call(city: str, **more) -> ParsedToolCall:
    return ParsedToolCall("get_weather", json.dumps({"city": city, **more}, ensure_ascii=False))


def test_hermes_single_call():
    reply = parse_hermes(f"<tool_call>\n{PARIS}\n</tool_call>")
    assert reply == ParsedReply(content=None, tool_calls=(call("Paris"),))


def test_hermes_several_calls_with_text_around():
    text = f"Checking both.\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>{TOKYO}</tool_call>\nok"
    reply = parse_hermes(text)
    assert reply.tool_calls == (call("Paris"), call("Tokyo", unit="°C"))
    assert reply.content == "Checking both.\n\n\nok"


def test_hermes_unclosed_last_call_and_string_arguments():
    text = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}'
    assert parse_hermes(text).tool_calls == (ParsedToolCall("f", '{"x": 1}'),)


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        f"<tool_call>{PARIS}</tool_call><tool_call>oops</tool_call>",
        "no calls at all ",
        # Python refuses to convert an integer of over 4,300 digits: not a call either.
        '<tool_call>{"name": "f", "arguments": {"x": ' + "9" * 4301 + "}}</tool_call>",
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": ' + "9" * 4301 + '}"}</tool_call>',
    ],
)
def test_hermes_malformed_markup_is_plain_text(text):
    assert parse_hermes(text) == ParsedReply(content=text)


def test_llama3_json_with_and_without_python_tag():
    for text in (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        ' {"name": "get_weather", "arguments": {"city": "Paris"}}\n',
    ):
        assert parse_llama3_json(text) == ParsedReply(content=None, tool_calls=(call("Paris"),))


@pytest.mark.parametrize("text", ['{"city": "Paris"}', '{"name": "f", "parameters": 3}', "{", "hi"])
def test_llama3_json_that_is_no_call_is_plain_text(text):
    assert parse_llama3_json(text) == ParsedReply(content=text)


def test_detect_format_from_the_template_text():
    assert detect_format("... <tool_call> ...") is ToolCallFormat.HERMES
    assert detect_format("{{ '<|start_header_id|>ipython' }}") is ToolCallFormat.LLAMA3_JSON
    assert detect_format("{{ '<|python_tag|>' }}") is ToolCallFormat.LLAMA3_JSON
    assert detect_format("<|im_start|>") is None and detect_format(None) is None


def feed_chars(stream: ToolCallStream, text: str) -> str:
    return "".join(stream.feed(char) for char in text)


def test_stream_sends_text_then_holds_hermes_markup():
    stream = ToolCallStream(ToolCallFormat.HERMES)
    sent = feed_chars(stream, f"Let me see <tool but\n<tool_call>{PARIS}</tool_call>")
    assert sent == "Let me see <tool but\n"
    assert stream.finish().tool_calls == (call("Paris"),)


def test_stream_returns_a_held_partial_marker_as_text():
    stream = ToolCallStream(ToolCallFormat.HERMES)
    assert feed_chars(stream, "a <tool_c") == "a "
    assert stream.finish() == ParsedReply(content="<tool_c")


def test_stream_llama3_holds_json_and_passes_prose():
    prose = ToolCallStream(ToolCallFormat.LLAMA3_JSON)
    assert feed_chars(prose, " Hello {there}") == " Hello {there}"
    assert prose.finish() == ParsedReply(content=None)
    json_call = ToolCallStream(ToolCallFormat.LLAMA3_JSON)
    assert feed_chars(json_call, '<|python_tag|>{"name": "f", "parameters": {}}') == ""
    assert json_call.finish().tool_calls == (ParsedToolCall("f", "{}"),)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [('{"city": "Paris"}', {"city": "Paris"}), ("{not json", "{not json"),
     ('{"x": ' + "9" * 4301 + "}", '{"x": ' + "9" * 4301 + "}")],
)  # fmt: skip
def test_request_tool_call_arguments_reach_templates_as_objects_where_they_parse(
    arguments, expected
):
    tool_call = ToolCall(id="c1", type="function", function={"name": "f", "arguments": arguments})
    assert tool_call.template_dict()["function"]["arguments"] == expected
