"""Tools on the Responses API and the choices Anthropic's API maps onto chat's, and
llama-server's and vLLM's request fields reaching the engine, in-process on the scripted
engine (a Hermes template renders the prompts; the engine replays two calls)."""

import json

import pytest
from test_chat_tools import WEATHER_TOOL, hermes_loaded_decode
from test_responses_api import named_events

from mlxcel_core.request import FinishReason
from mlxcel_server.anthropic_api.conversation import chat_request
from mlxcel_server.anthropic_api.request import CountTokensRequest
from mlxcel_server.schemas import NamedToolChoice

RESPONSES = "/v1/responses"
FUNCTION = {"type": "function", **WEATHER_TOOL["function"], "strict": True}
ASK = "Weather in Paris and Tokyo?"


def respond(client, **fields):
    return client.post(RESPONSES, {"input": ASK, "tools": [FUNCTION], **fields})


def test_calls_are_function_call_items_after_the_message(make_tool_client):
    client, engine = make_tool_client()
    body = respond(client).json()
    assert body["status"] == "completed" and body["tool_choice"] == "auto"
    assert body["tools"] == [FUNCTION] and body["parallel_tool_calls"] is True
    message, *calls = body["output"]
    assert message["type"] == "message"
    assert message["content"][0]["text"] == "I'll check both cities."
    assert [c["type"] for c in calls] == ["function_call", "function_call"]
    assert [json.loads(c["arguments"]) for c in calls] == [
        {"city": "Paris"},
        {"city": "Tokyo", "unit": "°C"},
    ]
    assert all(c["call_id"].startswith("call_") and c["id"].startswith("fc_") for c in calls)
    assert engine.requests[-1].constraint is not None
    assert "# Tools" in hermes_loaded_decode(client, engine.prompts[-1])


def test_streamed_calls_match_the_unstreamed_items(make_tool_client):
    client, _ = make_tool_client()
    full = respond(client).json()
    events = named_events(respond(client, stream=True).body)
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    added = [data["item"] for name, data in events if name == "response.output_item.added"]
    assert [item["type"] for item in added] == ["message", "function_call", "function_call"]
    assert all(item["arguments"] == "" for item in added[1:])
    pieces: dict[int, list[str]] = {}
    for name, data in events:
        if name == "response.function_call_arguments.delta":
            pieces.setdefault(data["output_index"], []).append(data["delta"])
    done = {
        data["output_index"]: data["arguments"]
        for name, data in events
        if name == "response.function_call_arguments.done"
    }
    final = events[-1][1]["response"]
    assert {i: "".join(p) for i, p in pieces.items()} == done
    assert [final["output"][i]["arguments"] for i in (1, 2)] == [done[1], done[2]]
    assert [item["arguments"] for item in full["output"][1:]] == [done[1], done[2]]
    assert all(len(p) > 1 for p in pieces.values())
    sequence = [data["sequence_number"] for _, data in events]
    assert sequence == list(range(len(events)))


def test_call_outputs_continue_from_the_stored_response(make_tool_client):
    client, engine = make_tool_client()
    first = respond(client).json()
    engine.reply = "Paris is sunny, Tokyo rainy."
    outputs = [
        {"type": "function_call_output", "call_id": item["call_id"], "output": f"result {i}"}
        for i, item in enumerate(first["output"][1:])
    ]
    body = {"previous_response_id": first["id"], "input": outputs, "tool_choice": "none"}
    second = respond(client, **body).json()
    assert [item["type"] for item in second["output"]] == ["message"]
    prompt = hermes_loaded_decode(client, engine.prompts[-1])
    assert prompt.count("<tool_response>") == 2 and "result 1" in prompt
    assert '"arguments": {"city": "Tokyo", "unit": "°C"}' in prompt
    # The same turn with the call items sent back instead of a stored response.
    items = [{"role": "user", "content": ASK}, *first["output"], *outputs]
    respond(client, input=items, tool_choice="none")
    assert hermes_loaded_decode(client, engine.prompts[-1]) == prompt


def test_forced_choices_and_a_cut_reply(make_tool_client):
    client, engine = make_tool_client()
    named = respond(client, tool_choice={"type": "function", "name": "get_weather"}).json()
    assert named["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert engine.requests[-1].constraint is not None
    engine.finish_reason = FinishReason.LENGTH
    cut = respond(client, tool_choice="required").json()
    assert cut["status"] == "incomplete" and cut["output"][-1]["status"] == "incomplete"
    assert {item["status"] for item in cut["output"][:-1]} == {"completed"}


def test_chat_finish_reason_is_length_when_the_limit_cuts_a_call(make_tool_client):
    client, engine = make_tool_client()
    engine.finish_reason = FinishReason.LENGTH
    body = {"messages": [{"role": "user", "content": ASK}], "tools": [WEATHER_TOOL]}
    choice = client.post("/v1/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["message"]["tool_calls"]) == 2
    events = client.post("/v1/chat/completions", {**body, "stream": True}).events()
    assert events[-2]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "any"}, "required", None),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
        ({"type": "none"}, "none", None),
        (
            {"type": "tool", "name": "get_weather"},
            NamedToolChoice.model_validate(
                {"type": "function", "function": {"name": "get_weather"}}
            ),
            None,
        ),
    ],
)
def test_anthropic_choices_map_onto_chat(choice, expected, parallel):
    tool = {"name": "get_weather", "input_schema": {"type": "object"}}
    body = CountTokensRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [tool],
            "tool_choice": choice,
        }
    )
    chat = chat_request(body)
    assert chat.tool_choice == expected and chat.parallel_tool_calls is parallel


def test_llama_server_and_vllm_fields_reach_the_engine(make_tool_client):
    client, engine = make_tool_client()
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "cache_prompt": False,
        "ignore_eos": True,
        "min_tokens": 3,
        "n_probs": 2,
        "samplers": ["min_p", "temperature"],
        "t_max_predict_ms": 1500,
        "id_slot": 0,
    }
    assert client.post("/v1/chat/completions", body).status == 200
    request = engine.requests[-1]
    generation = request.generation
    assert request.use_prefix_cache is False and generation.ignore_eos is True
    assert generation.min_tokens == 3 and generation.num_top_logprobs == 2
    assert generation.max_predict_seconds == 1.5
    assert [stage.value for stage in request.sampling.samplers] == ["min_p", "temperature"]
    letters = {"messages": body["messages"], "samplers": "kt", "n_probs": 1}
    assert client.post("/v1/chat/completions", letters).status == 200
    request = engine.requests[-1]
    assert [s.value for s in request.sampling.samplers] == ["top_k", "temperature"]
    assert request.use_prefix_cache is True and request.generation.num_top_logprobs == 1
