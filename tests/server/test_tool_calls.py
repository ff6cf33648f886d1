"""Tool calls without a model: reading each convention (whole and streamed), the JSON scanner,
the grammars on the real SmolLM2 tokenizer, and the generic convention's prompt."""

import json
from functools import reduce

import pytest

from mlxcel_models.default_model import default_model_path
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server.schemas import ChatMessage
from mlxcel_server.structured import compile_grammar, lark_grammar
from mlxcel_server.tools.conventions import ToolCallFormat, detect_format
from mlxcel_server.tools.generic import generic_messages
from mlxcel_server.tools.grammar import make_tool_grammar
from mlxcel_server.tools.json_scan import JsonScanner
from mlxcel_server.tools.reader import (
    ParsedReply,
    ParsedToolCall,
    ToolCallReader,
    collect,
    read_reply,
)
from mlxcel_server.tools.use import FunctionTool, ToolUse

PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TOKYO = '{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "°C"}}'
WEATHER = FunctionTool(
    "get_weather",
    "Current weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["°C", "°F"]}},
        "required": ["city"],
    },
)
ZONE = FunctionTool(
    "get_time",
    None,
    {
        "$defs": {"Zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "type": "object",
        "properties": {"zone": {"$ref": "#/$defs/Zone"}},
        "required": ["zone"],
    },
)


def call(city: str, **more) -> ParsedToolCall:
    return ParsedToolCall("get_weather", json.dumps({"city": city, **more}, ensure_ascii=False))


def streamed(text: str, tool_format: ToolCallFormat, size: int, **options) -> ParsedReply:
    reader = ToolCallReader(tool_format, **options)
    pieces = [reader.feed(text[i : i + size]) for i in range(0, len(text), size)]
    return collect(reduce(lambda a, b: a + b, [*pieces, reader.finish()]))


@pytest.mark.parametrize(
    ("tool_format", "text", "expected"),
    [
        (
            ToolCallFormat.HERMES,
            f"Checking both.\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>{TOKYO}</tool_call>",
            ParsedReply("Checking both.", (call("Paris"), call("Tokyo", unit="°C"))),
        ),
        (
            ToolCallFormat.LLAMA3_JSON,
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
            ParsedReply(None, (call("Paris"),)),
        ),
        (
            ToolCallFormat.MISTRAL,
            f"[TOOL_CALLS][{PARIS}, {TOKYO}]",
            ParsedReply(None, (call("Paris"), call("Tokyo", unit="°C"))),
        ),
        (
            ToolCallFormat.GENERIC,
            f'{{"tool_calls": [{PARIS}, {TOKYO}]}}',
            ParsedReply(None, (call("Paris"), call("Tokyo", unit="°C"))),
        ),
        (ToolCallFormat.GENERIC, "Sunny {all} day ", ParsedReply("Sunny {all} day ")),
        (ToolCallFormat.GENERIC, '{"answer": 42}', ParsedReply('{"answer": 42}')),
        (ToolCallFormat.GENERIC, "{} and more", ParsedReply("{} and more")),
        (ToolCallFormat.LLAMA3_JSON, '{"city": "Paris"}', ParsedReply('{"city": "Paris"}')),
        (ToolCallFormat.HERMES, "no calls at all ", ParsedReply("no calls at all ")),
        # Arguments before the name are held until the name comes.
        (
            ToolCallFormat.HERMES,
            '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call> ok',
            ParsedReply("ok", (call("Paris"),)),
        ),
    ],
)
def test_each_convention_reads_the_same_whole_or_in_any_pieces(tool_format, text, expected):
    assert read_reply(text, tool_format) == expected
    for size in (1, 3, 7):
        assert streamed(text, tool_format, size) == expected


def test_arguments_stream_as_written_after_a_first_delta_with_the_name():
    reader = ToolCallReader(ToolCallFormat.GENERIC)
    text = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Par'
    piece = reader.feed(text)
    assert [(d.index, d.name, d.arguments) for d in piece.calls] == [
        (0, "get_weather", '{"city": "Par')
    ]
    assert reader.feed('is"}}]}').calls[0].arguments == 'is"}'
    assert reader.finish().calls == ()


def test_a_reply_cut_short_keeps_its_partial_call():
    reply = read_reply('{"tool_calls": [{"name": "f", "arguments": {"x": 1', ToolCallFormat.GENERIC)
    assert reply == ParsedReply(None, (ParsedToolCall("f", '{"x": 1'),))
    assert reply.tool_calls[0].arguments_object() is None


def test_parallel_false_keeps_only_the_first_call():
    text = f"[TOOL_CALLS][{PARIS}, {TOKYO}]"
    assert read_reply(text, ToolCallFormat.MISTRAL, parallel=False).tool_calls == (call("Paris"),)


def test_json_scanner_paths_and_failures():
    scanner = JsonScanner()
    paths = [scanner.feed(c).path for c in '{"a": [1, {"b": "x\\"y"}]}']
    assert paths[0] == () and ("a", 1, "b") in paths and scanner.done
    broken = JsonScanner()
    for char in '{"a" 1}':
        broken.feed(char)
    assert broken.failed


def test_detect_format_from_the_template_text():
    assert detect_format("... <tool_call> ...") is ToolCallFormat.HERMES
    assert detect_format("{{ '<|start_header_id|>ipython' }}") is ToolCallFormat.LLAMA3_JSON
    assert detect_format("{{ '[TOOL_CALLS]' + tools }}") is ToolCallFormat.MISTRAL
    assert detect_format("[TOOL_CALLS]{{ name }}[ARGS]") is ToolCallFormat.GENERIC
    assert detect_format("<|im_start|>") is ToolCallFormat.GENERIC
    assert detect_format(None) is ToolCallFormat.GENERIC


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(
        read_gguf_header(default_model_path(), arrays=True).metadata
    )


def accepts(tokenizer: Tokenizer, use: ToolUse, text: str, answer=None) -> bool:
    grammar = lark_grammar(make_tool_grammar(use, tokenizer, answer), "tools")
    matcher = compile_grammar(grammar, tokenizer)
    ok = matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False))
    return ok and matcher.is_accepting()


GENERIC_CALL = '{"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}]}'
HERMES_CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("tool_format", "text", "auto", "required"),
    [
        (ToolCallFormat.GENERIC, "Hello there.", True, False),
        (ToolCallFormat.GENERIC, GENERIC_CALL, True, True),
        (ToolCallFormat.GENERIC, GENERIC_CALL.replace('"UTC"', '"PST"'), False, False),
        (ToolCallFormat.GENERIC, GENERIC_CALL.replace("get_time", "get_date"), False, False),
        (ToolCallFormat.GENERIC, GENERIC_CALL.replace(": ", ":"), False, False),
        (ToolCallFormat.HERMES, "Hello there.", True, False),
        (ToolCallFormat.HERMES, "Let me see.\n" + HERMES_CALL, True, False),
        (ToolCallFormat.HERMES, HERMES_CALL, True, True),
        (ToolCallFormat.HERMES, "Sure <tool_call>\n{oops}", False, False),
        (
            ToolCallFormat.LLAMA3_JSON,
            '{"name": "get_time", "parameters": {"zone": "CET"}}',
            True,
            True,
        ),
        (
            ToolCallFormat.MISTRAL,
            '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "CET"}}]',
            True,
            True,
        ),
    ],
)
def test_grammars_allow_answers_only_under_auto_and_only_valid_calls(
    smollm2_tokenizer, tool_format, text, auto, required
):
    for is_required, expected in ((False, auto), (True, required)):
        use = ToolUse(tool_format, (WEATHER, ZONE), (WEATHER, ZONE), is_required, True)
        assert accepts(smollm2_tokenizer, use, text) is expected, (is_required, text)


def test_named_choice_and_response_format_answers(smollm2_tokenizer):
    named = ToolUse(ToolCallFormat.GENERIC, (WEATHER, ZONE), (ZONE,), True, True)
    assert accepts(smollm2_tokenizer, named, GENERIC_CALL)
    weather = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}'
    assert not accepts(smollm2_tokenizer, named, weather)
    single = ToolUse(ToolCallFormat.GENERIC, (ZONE,), (ZONE,), True, False)
    assert not accepts(
        smollm2_tokenizer, single, GENERIC_CALL.replace("]}", ", " + GENERIC_CALL[16:-2] + "]}")
    )
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    auto = ToolUse(ToolCallFormat.GENERIC, (ZONE,), (ZONE,), False, True)
    assert accepts(smollm2_tokenizer, auto, '{"n": 3}', schema)
    assert accepts(smollm2_tokenizer, auto, GENERIC_CALL, schema)
    assert not accepts(smollm2_tokenizer, auto, "free text", schema)


def test_generic_prompt_writes_tools_calls_and_results_as_text():
    history = [
        ChatMessage(role="user", content="Weather?"),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            }
        ),
        ChatMessage(role="tool", tool_call_id="c1", content="sunny"),
    ]
    use = ToolUse(ToolCallFormat.GENERIC, (WEATHER,), (WEATHER,), False, True)
    system, user, assistant, results = generic_messages(history, use)
    assert system.role == "system" and '"name": "get_weather"' in system.text()
    assert "tool_calls" in system.text() and "plain text" in system.text()
    assert user.text() == "Weather?"
    assert json.loads(assistant.text()) == {
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    }
    assert results.role == "user"
    assert json.loads(results.text()) == {
        "tool_response": {"name": "get_weather", "content": "sunny"}
    }
    with_system = generic_messages([ChatMessage(role="system", content="Be brief."), user], use)
    assert with_system[0].text().startswith("Be brief.\n\nYou can call")
    assert generic_messages(history, None)[0] == user
