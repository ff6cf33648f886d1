"""Tool calling through `/v1/chat/completions`, on a Hermes-style template and a scripted engine.

A random model never writes tool markup, so the engine here replays a fixed reply in pieces
(split inside the markup) while the tiny model's tokenizer renders the prompts.
"""

import json

import pytest
from replay_engine import TWO_CALLS

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Paris and Tokyo?"}]
CHAT = "/v1/chat/completions"


def ask(client, **fields):
    return client.post(CHAT, {"messages": ASK, "tools": [WEATHER_TOOL], **fields})


def test_two_calls_unstreamed(make_tool_client):
    client, engine = make_tool_client()
    reply = ask(client)
    assert reply.status == 200, reply.body
    (choice,) = reply.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "I'll check both cities."
    calls = message["tool_calls"]
    assert [c["type"] for c in calls] == ["function", "function"]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris"},
        {"city": "Tokyo", "unit": "°C"},
    ]
    prompt = hermes_loaded_decode(client, engine.prompts[-1])
    assert '"name": "get_weather"' in prompt and "# Tools" in prompt


def hermes_loaded_decode(client, ids) -> str:
    return client.post("/detokenize", {"tokens": list(ids)}).json()["content"]


def test_two_calls_streamed_match_the_unstreamed_reply(make_tool_client):
    client, _ = make_tool_client()
    full = ask(client).json()["choices"][0]["message"]
    events = ask(client, stream=True).events()
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    content = "".join(d["content"] or "" for d in deltas)
    assert "<tool" not in content and "</" not in content
    assert content.strip() == full["content"]
    streamed = [call for d in deltas for call in d["tool_calls"] or []]
    # Each call's first piece names it; its arguments follow in the pieces generated.
    firsts = [call for call in streamed if "id" in call]
    assert [call["index"] for call in firsts] == [0, 1]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in firsts)
    assert [c["function"]["name"] for c in firsts] == ["get_weather", "get_weather"]
    assert all(set(c) == {"index", "function"} for c in streamed if "id" not in c)
    assert len(streamed) > 4
    arguments: dict[int, str] = {}
    for call in streamed:
        arguments[call["index"]] = arguments.get(call["index"], "") + call["function"]["arguments"]
    assert [arguments[i] for i in (0, 1)] == [
        c["function"]["arguments"] for c in full["tool_calls"]
    ]
    finishes = [e["choices"][0]["finish_reason"] for e in events[:-1]]
    assert [f for f in finishes if f] == ["tool_calls"] and finishes[-1] == "tool_calls"


def test_follow_up_with_tool_results_renders_through_the_template(make_tool_client):
    client, engine = make_tool_client()
    calls = ask(client).json()["choices"][0]["message"]["tool_calls"]
    engine.reply = "Paris is 18 °C and Tokyo 24 °C."
    history = [
        {"role": "developer", "content": "Be brief."},
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"temp": 18}'},
        {"role": "tool", "tool_call_id": calls[1]["id"], "content": '{"temp": 24}'},
    ]
    reply = client.post(CHAT, {"messages": history, "tools": [WEATHER_TOOL]})
    assert reply.status == 200, reply.body
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["tool_calls"] is None
    prompt = hermes_loaded_decode(client, engine.prompts[-1])
    assert "system\nBe brief." in prompt
    assert '"arguments": {"city": "Tokyo", "unit": "°C"}' in prompt
    assert prompt.count("<tool_response>") == 2 and '{"temp": 24}' in prompt
    applied = client.post("/apply-template", {"messages": history}).json()["prompt"]
    assert applied.count("<tool_response>") == 2


def test_parallel_tool_calls_false_keeps_the_first_call(make_tool_client):
    client, _ = make_tool_client()
    calls = ask(client, parallel_tool_calls=False).json()["choices"][0]["message"]["tool_calls"]
    assert len(calls) == 1 and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    events = ask(client, parallel_tool_calls=False, stream=True).events()[:-1]
    streamed = [call for e in events for call in e["choices"][0]["delta"].get("tool_calls") or []]
    assert {call["index"] for call in streamed} == {0}


def test_markup_that_breaks_off_reads_the_same_streamed_or_not(make_tool_client):
    # The grammar never lets a model write this; a reply is still read one way only.
    text = 'Sure <tool_call>\n{"name": "get_weather", "arguments": {oops}\n</tool_call>'
    client, _ = make_tool_client(text)
    message = ask(client).json()["choices"][0]["message"]
    events = ask(client, stream=True).events()[:-1]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]
    streamed = [call for d in deltas for call in d.get("tool_calls") or []]
    assert "".join(c["function"]["arguments"] for c in streamed) == "{"
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ["{"]


def test_tool_choice_none_neither_renders_nor_parses(make_tool_client):
    client, engine = make_tool_client()
    choice = ask(client, tool_choice="none").json()["choices"][0]
    assert choice["message"]["content"] == TWO_CALLS and choice["finish_reason"] == "stop"
    assert "# Tools" not in hermes_loaded_decode(client, engine.prompts[-1])


@pytest.mark.parametrize(
    ("fields", "param", "text"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
            "tool_choice",
            "not among the tools",
        ),
        ({"tools": None, "tool_choice": "auto"}, "tool_choice", "needs tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, None, "pattern"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]", "tool_call_id"),
    ],
)
def test_tool_fields_that_cannot_be_honoured_are_400s(make_tool_client, fields, param, text):
    client, _ = make_tool_client()
    reply = ask(client, **fields)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert text in error["message"]
    if param is not None:
        assert error["param"] == param


def test_every_tool_request_is_constrained_and_none_is_not(make_tool_client):
    client, engine = make_tool_client()
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        assert ask(client, tool_choice=choice).status == 200
        assert engine.requests[-1].constraint is not None
    ask(client, tool_choice="none")
    assert engine.requests[-1].constraint is None
