"""A tool schema llguidance cannot enforce is a 400 of one line naming the tool and the
schema's problem, on chat completions, the Responses API and Anthropic's Messages API,
never the grammar text llguidance quotes in its own error."""

import pytest
from replay_engine import ScriptedEngine

from mlxcel_server.structured import one_line

BAD_SCHEMAS = [
    ({"type": "strang"}, "Invalid type: strang"),
    (
        {"type": "object", "properties": {"code": {"type": "string", "pattern": "(("}}},
        "invalid regular expression '((': unclosed group",
    ),
    ({"type": "object", "properties": {"a": {"not": {}}}}, "Unimplemented keys"),
]


@pytest.fixture
def client(make_client):
    return make_client(2048, engine=ScriptedEngine("OK"))


def assert_one_line(message: str, problem: str) -> None:
    assert "\n" not in message
    assert "'lookup'" in message and problem in message
    assert "start:" not in message and "%json" not in message


@pytest.mark.parametrize(("schema", "problem"), BAD_SCHEMAS)
def test_chat_names_the_tool_and_the_problem(client, schema, problem):
    tool = {"type": "function", "function": {"name": "lookup", "parameters": schema}}
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    reply = client.post("/v1/chat/completions", body)
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["param"] == "tools"
    assert_one_line(error["message"], problem)


@pytest.mark.parametrize(("schema", "problem"), BAD_SCHEMAS)
def test_responses_and_anthropic_name_the_tool_and_the_problem(client, schema, problem):
    tool = {"type": "function", "name": "lookup", "parameters": schema}
    reply = client.post("/v1/responses", {"input": "hi", "tools": [tool]})
    assert reply.status == 400
    assert_one_line(reply.json()["error"]["message"], problem)
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "lookup", "input_schema": schema}]}  # fmt: skip
    reply = client.post("/v1/messages", body)
    assert reply.status == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert_one_line(reply.json()["error"]["message"], problem)


def test_one_line_leaves_out_the_quoted_grammar():
    error = (
        "at 3(8): failed to compile JSON schema: regex parse error:\n    ((\n     ^\n"
        "error: unclosed group\n   1 | start: TEXT | calls\n   2 | TEXT: /x/\n"
        '   3 | calls: %json {"type": "object"}\n              ^\n'
    )
    assert one_line(error) == (
        "failed to compile JSON schema: invalid regular expression '((': unclosed group"
    )
    assert one_line('at 1(8): unknown name: "foo"\n   1 | start: foo\n              ^\n') == (
        'unknown name: "foo"'
    )
