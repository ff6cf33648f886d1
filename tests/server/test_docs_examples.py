"""The docs' client examples run as written against a server whose model has another id:
every model name they use is served, and the Responses and Anthropic tool examples'
requests (docs/server.md, docs/anthropic.md) go through, turn after turn."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).parents[2] / "docs"
ONE_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def documented_model_names() -> set[str]:
    text = "".join((DOCS / name).read_text() for name in ("server.md", "anthropic.md"))
    return set(re.findall(r'model="([^"]+)"', text))


def test_the_docs_use_names_other_than_the_served_id():
    assert {"smollm2", "my-model"} <= documented_model_names()


@pytest.mark.parametrize("name", sorted(documented_model_names()))
def test_every_documented_model_name_is_served(make_tool_client, name):
    client, _ = make_tool_client("Paris.")
    chat = {"model": name, "messages": [{"role": "user", "content": "Capital of France?"}]}
    reply = client.post("/v1/chat/completions", chat)
    assert reply.status == 200 and reply.json()["model"] == "tiny"
    anthropic = {**chat, "max_tokens": 8}
    assert client.post("/v1/messages", anthropic).status == 200


def test_the_responses_tool_example(make_tool_client):
    client, _ = make_tool_client(ONE_CALL)
    tool = {"type": "function", "name": "get_weather", "parameters": PARAMETERS}
    first = client.post(
        "/v1/responses",
        {"model": "smollm2", "input": "Weather in Paris?", "tools": [tool],
         "tool_choice": "required"},
    ).json()  # fmt: skip
    call = first["output"][0]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    final = client.post(
        "/v1/responses",
        {"model": "smollm2", "previous_response_id": first["id"],
         "input": [{"type": "function_call_output", "call_id": call["call_id"],
                    "output": "Sunny"}],
         "tools": [tool], "tool_choice": "none"},
    )  # fmt: skip
    assert final.status == 200 and final.json()["status"] == "completed"


def test_the_anthropic_tool_example(make_tool_client):
    client, _ = make_tool_client(ONE_CALL)
    tool = {"name": "get_weather", "description": "Get the current weather in a city",
            "input_schema": PARAMETERS}  # fmt: skip
    question = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    first = client.post(
        "/v1/messages",
        {"model": "smollm2", "max_tokens": 64, "messages": question, "tools": [tool],
         "tool_choice": {"type": "any"}},
    ).json()  # fmt: skip
    call = first["content"][0]
    assert call["type"] == "tool_use" and first["stop_reason"] == "tool_use"
    answer = {"type": "tool_result", "tool_use_id": call["id"], "content": "Sunny, 21 C."}
    final = client.post(
        "/v1/messages",
        {"model": "smollm2", "max_tokens": 64, "tools": [tool],
         "tool_choice": {"type": "none"},
         "messages": [*question, {"role": "assistant", "content": first["content"]},
                      {"role": "user", "content": [answer]}]},
    )  # fmt: skip
    assert final.status == 200 and final.json()["type"] == "message"
