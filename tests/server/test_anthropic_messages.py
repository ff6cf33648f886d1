"""`/v1/messages` and `/v1/messages/count_tokens` in-process: Anthropic's shapes, stop reasons,
stop sequences, the event stream, tools and errors.

Plain generation runs the tiny random model greedily; tool calls come from the scripted engine
of the chat tool tests, replaying Hermes markup, with prompts rendered by a Hermes template.
"""

import json

import pytest
from replay_engine import TWO_CALLS

from mlxcel_core.engine import EngineOutput, EngineOverloadedError, RequestHandle
from mlxcel_core.request import FinishReason
from mlxcel_server.anthropic_api.conversation import ERROR_RESULT_PREFIX
from mlxcel_server.anthropic_api.stop_reason import Ending, EndingTracker

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
HELLO = [{"role": "user", "content": "hello"}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "Weather in Paris and Tokyo?"}]
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
THINKING = {"type": "thinking", "thinking": "I should look both up.", "signature": "s"}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}


def create(client, **fields):
    body = {"model": "tiny", "max_tokens": 8, "messages": HELLO, "temperature": 0, **fields}
    return client.post(MESSAGES, body)


def named_events(body: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE block; the data repeats the name as `type`."""
    events = []
    for block in body.decode().split("\n\n"):
        if block:
            name_line, data_line = block.split("\n")
            name, data = name_line.removeprefix("event: "), json.loads(data_line[6:])
            assert data["type"] == name
            events.append((name, data))
    return events


def streamed_text(events: list[tuple[str, dict]]) -> str:
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    return "".join(delta["text"] for delta in deltas if delta["type"] == "text_delta")


def assert_anthropic_error(reply, status: int, error_type: str, text: str = "") -> None:
    assert reply.status == status, reply.body
    body = reply.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == error_type
    assert text in body["error"]["message"], body["error"]["message"]


def test_message_shape_and_usage(client):
    reply = create(client, max_tokens=4)
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["id"].startswith("msg_") and body["type"] == "message"
    assert body["role"] == "assistant" and body["model"] == "tiny"
    assert [block["type"] for block in body["content"]] == ["text"]
    assert body["stop_reason"] == "max_tokens" and body["stop_sequence"] is None
    counted = client.post(COUNT, {"model": "tiny", "messages": HELLO}).json()["input_tokens"]
    usage = body["usage"]
    assert usage["output_tokens"] == 4
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == counted


def test_unversioned_paths_and_anthropic_headers(client):
    headers = {"anthropic-version": "2023-06-01"}
    body = {"model": "tiny", "max_tokens": 2, "messages": HELLO}
    assert client.post("/messages", body, headers=headers).status == 200
    count = client.post("/messages/count_tokens", {"model": "tiny", "messages": HELLO})
    assert count.status == 200 and count.json()["input_tokens"] > 0


def test_count_tokens_is_the_rendered_prompt_length(client, tiny_loaded):
    body = {
        "model": "tiny",
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "what now?"},
        ],
    }
    chat = [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "what now?"},
    ]
    expected = len(tiny_loaded.tokenizer.encode_chat(chat))
    assert client.post(COUNT, body).json() == {"input_tokens": expected}


def test_cache_control_is_accepted_where_anthropic_allows_it(client):
    ephemeral = {"type": "ephemeral"}
    text = {"type": "text", "text": "hello", "cache_control": ephemeral}
    cached = [{"role": "user", "content": [text]}]
    system = [{"type": "text", "text": "Be brief.", "cache_control": {**ephemeral, "ttl": "1h"}}]
    reply = create(client, messages=cached, system=system, cache_control=ephemeral, max_tokens=2)
    assert reply.status == 200, reply.body
    count = client.post(COUNT, {"model": "tiny", "messages": cached, "cache_control": ephemeral})
    assert count.status == 200, count.body


def test_stop_sequences_end_the_reply_and_are_named(client):
    story = [{"role": "user", "content": "Tell me a story"}]
    full = create(client, messages=story, max_tokens=12).json()["content"][0]["text"]
    # The first character unlike the first one starts a stop sequence met only there.
    cut = next(index for index, char in enumerate(full) if char != full[0])
    stop = full[cut:]
    body = create(client, messages=story, max_tokens=12, stop_sequences=[stop]).json()
    assert body["stop_reason"] == "stop_sequence" and body["stop_sequence"] == stop
    assert body["content"] == [{"type": "text", "text": full[:cut]}]
    reply = create(client, messages=story, max_tokens=12, stop_sequences=[stop], stream=True)
    events = named_events(reply.body)
    (delta,) = [data for name, data in events if name == "message_delta"]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}
    assert streamed_text(events) == full[:cut]
    # The sequence met first in the text is named, whatever the request's order.
    body = create(client, messages=story, max_tokens=12, stop_sequences=[stop, full[0]]).json()
    assert body["stop_sequence"] == full[0] and body["content"] == []


def test_stream_events_come_in_anthropic_order_and_match_the_unstreamed_reply(client):
    full = create(client).json()
    events = named_events(create(client, stream=True).body)
    names = [name for name, _ in events]
    deltas = names.count("content_block_delta")
    assert deltas >= 1
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["model"] == "tiny"
    assert start["stop_reason"] is None
    assert events[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert streamed_text(events) == full["content"][0]["text"]
    message_delta = events[-2][1]
    assert message_delta["delta"] == {"stop_reason": full["stop_reason"], "stop_sequence": None}
    usage, full_usage = message_delta["usage"], full["usage"]
    # The second request reads the first one's prompt from the prefix cache.
    assert usage["cache_read_input_tokens"] > 0 == full_usage["cache_read_input_tokens"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == full_usage["input_tokens"]
    assert usage["output_tokens"] == full_usage["output_tokens"]


@pytest.mark.parametrize(
    ("stops", "finish_reason", "calls_tools", "ending"),
    [
        ((), FinishReason.STOP, False, Ending("end_turn")),
        (("Tokyo",), FinishReason.STOP, False, Ending("end_turn")),
        (("sunny", "is"), FinishReason.STOP, False, Ending("stop_sequence", "is")),
        (("is", "Paris is"), FinishReason.STOP, False, Ending("stop_sequence", "Paris is")),
        (("sunny",), FinishReason.LENGTH, False, Ending("max_tokens")),
        (("sunny",), FinishReason.STOP, True, Ending("tool_use")),
    ],
)
def test_ending_names_the_stop_sequence_met_first(
    tiny_loaded, stops, finish_reason, calls_tools, ending
):
    tokenizer = tiny_loaded.tokenizer
    tracker = EndingTracker(tokenizer, stops)
    for token_id in tokenizer.encode("Paris is sunny", add_special_tokens=False):
        tracker.add(EngineOutput(0, token_id=token_id))
    tracker.add(EngineOutput(0, finish_reason=finish_reason))
    assert tracker.ending(finish_reason, calls_tools=calls_tools) == ending


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "system", "content": "x"}]}, "role"),
        ({"messages": []}, "at least one message"),
        ({"messages": [{"role": "user", "content": []}]}, "content"),
        ({"messages": [{"role": "user", "content": ""}]}, "content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}, "text"),
        ({"messages": [*HELLO, {"role": "assistant", "content": "The"}]}, "prefill"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}},
            "max_tokens must be greater than thinking.budget_tokens",
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "budget_tokens"),
        ({"thinking": {"type": "adaptive"}}, "thinking"),
        ({"frequency_penalty": 1.0}, "unsupported parameter"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "x"}}, "not among"),
        ({"messages": [{"role": "user", "content": [IMAGE]}]}, "has no vision support"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "document",
        ),
        (
            {"messages": [{"role": "user", "content": [THINKING]}]},
            "a user message may not hold thinking blocks",
        ),
    ],
)
def test_invalid_requests_are_anthropic_400s(client, fields, text):
    body = {"model": "tiny", "max_tokens": 4, "messages": HELLO, **fields}
    body = {key: value for key, value in body.items() if value is not None}
    assert_anthropic_error(client.post(MESSAGES, body), 400, "invalid_request_error", text)


def test_malformed_json_and_bad_paths_are_anthropic_errors(client):
    reply = client.post(MESSAGES, data=b"{not json", headers={"Content-Type": "application/json"})
    assert_anthropic_error(reply, 400, "invalid_request_error", "not valid JSON")
    reply = client.post("/v1/messages/batches", {})
    assert_anthropic_error(reply, 404, "not_found_error")
    assert_anthropic_error(client.get(MESSAGES), 405, "invalid_request_error")
    # The OpenAI routes keep OpenAI's shape.
    assert set(client.post("/v1/chat/completions", {}).json()) == {"error"}


def test_api_key_in_x_api_key_or_bearer(make_client):
    secured = make_client(api_keys=("k1",))
    body = {"model": "tiny", "max_tokens": 2, "messages": HELLO}
    assert_anthropic_error(secured.post(MESSAGES, body), 401, "authentication_error")
    reply = secured.post(MESSAGES, body, headers={"x-api-key": "nope"})
    assert_anthropic_error(reply, 401, "authentication_error")
    assert secured.post(MESSAGES, body, headers={"x-api-key": "k1"}).status == 200
    assert secured.post(MESSAGES, body, headers={"Authorization": "Bearer k1"}).status == 200


def test_an_oversized_body_is_request_too_large(make_client):
    small = make_client(max_body_bytes=64)
    reply = small.post(MESSAGES, {"model": "tiny", "max_tokens": 2, "messages": HELLO * 10})
    assert_anthropic_error(reply, 413, "request_too_large", "64 bytes")


class FailingEngine:
    """Fails every request while generating."""

    def submit(self, requests, sink):
        for request in requests:
            sink.put(EngineOutput(request.index, error=RuntimeError("a broken step")))
        return RequestHandle(1)

    def shutdown(self, timeout=None):
        return None


def test_a_failure_while_generating_is_an_api_error(make_client):
    client = make_client(engine=FailingEngine())
    assert_anthropic_error(create(client), 500, "api_error", "generation failed")
    events = named_events(create(client, stream=True).body)
    assert [name for name, _ in events] == ["error"]
    assert events[0][1]["error"]["type"] == "api_error"


class OverloadedEngine:
    def submit(self, requests, sink):
        raise EngineOverloadedError("the waiting queue is full", retry_after_seconds=2)

    def shutdown(self, timeout=None):
        return None


def test_full_queue_and_loading_are_529_overloaded(make_client, loading_client):
    reply = create(make_client(engine=OverloadedEngine()))
    assert_anthropic_error(reply, 529, "overloaded_error", "queue is full")
    assert reply.headers["Retry-After"] == "2"
    loading = loading_client.post(MESSAGES, {"model": "tiny", "max_tokens": 2, "messages": HELLO})
    assert_anthropic_error(loading, 529, "overloaded_error", "loading")


def test_requests_count_in_the_server_totals(make_client):
    client = make_client(endpoint_metrics=True)
    create(client, max_tokens=3)
    create(client, max_tokens=2, stream=True)
    metrics = client.get("/metrics").body.decode()
    (line,) = [m for m in metrics.splitlines() if m.startswith("llamacpp:tokens_predicted_total")]
    assert float(line.split()[-1]) == 5


def ask(client, **fields):
    return create(client, messages=ASK, tools=[WEATHER_TOOL], max_tokens=64, **fields)


def test_tool_calls_are_tool_use_blocks(make_tool_client, hermes_loaded):
    client, engine = make_tool_client()
    body = ask(client).json()
    assert body["stop_reason"] == "tool_use"
    text, *calls = body["content"]
    assert text == {"type": "text", "text": "I'll check both cities."}
    assert [call["type"] for call in calls] == ["tool_use", "tool_use"]
    assert all(call["id"].startswith("toolu_") for call in calls)
    assert calls[0]["id"] != calls[1]["id"]
    assert [(call["name"], call["input"]) for call in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Tokyo", "unit": "°C"}),
    ]
    prompt = hermes_loaded.tokenizer.decode(engine.prompts[-1], skip_special_tokens=False)
    assert "# Tools" in prompt and '"parameters": {"type": "object"' in prompt
    counted = client.post(COUNT, {"model": "tiny", "messages": ASK, "tools": [WEATHER_TOOL]})
    assert counted.json()["input_tokens"] == len(engine.prompts[-1])


def test_streamed_tool_calls_are_input_json_deltas(make_tool_client):
    client, _ = make_tool_client()
    events = named_events(ask(client, stream=True).body)
    assert "<tool" not in streamed_text(events)
    assert streamed_text(events).strip() == "I'll check both cities."
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use", "tool_use"]
    assert all(s["content_block"]["input"] == {} for s in starts[1:])
    pieces: dict[int, list[str]] = {}
    for name, data in events:
        if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            pieces.setdefault(data["index"], []).append(data["delta"]["partial_json"])
    # The input comes in the pieces it is generated in (the engine replays 7 characters a time).
    assert all(len(chunks) > 1 for chunks in pieces.values())
    inputs = {index: json.loads("".join(chunks)) for index, chunks in pieces.items()}
    assert inputs == {1: {"city": "Paris"}, 2: {"city": "Tokyo", "unit": "°C"}}
    stops = [data["index"] for name, data in events if name == "content_block_stop"]
    assert stops == [0, 1, 2]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_disable_parallel_tool_use_keeps_the_first_call(make_tool_client):
    client, _ = make_tool_client()
    choice = {"type": "auto", "disable_parallel_tool_use": True}
    content = ask(client, tool_choice=choice).json()["content"]
    assert [block["type"] for block in content] == ["text", "tool_use"]


def test_tool_choice_none_neither_renders_nor_parses(make_tool_client, hermes_loaded):
    client, engine = make_tool_client()
    body = ask(client, tool_choice={"type": "none"}).json()
    assert body["content"] == [{"type": "text", "text": TWO_CALLS}]
    assert body["stop_reason"] == "end_turn"
    assert "# Tools" not in hermes_loaded.tokenizer.decode(engine.prompts[-1])


def test_tool_results_render_through_the_template(make_tool_client, hermes_loaded):
    client, engine = make_tool_client()
    calls = [block for block in ask(client).json()["content"] if block["type"] == "tool_use"]
    engine.reply = "Paris is 18 °C; Tokyo is unknown."
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": [
                THINKING,
                {"type": "text", "text": "I'll check both cities."},
                *calls,
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": calls[0]["id"], "content": '{"temp": 18}'},
                {
                    "type": "tool_result",
                    "tool_use_id": calls[1]["id"],
                    "content": [{"type": "text", "text": "service down"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Summarise, please."},
            ],
        },
    ]
    body = create(client, messages=history, tools=[WEATHER_TOOL], system="Be brief.").json()
    assert body["stop_reason"] == "end_turn"
    assert body["content"] == [{"type": "text", "text": "Paris is 18 °C; Tokyo is unknown."}]
    prompt = hermes_loaded.tokenizer.decode(engine.prompts[-1], skip_special_tokens=False)
    assert "system\nBe brief." in prompt
    assert '"arguments": {"city": "Tokyo", "unit": "°C"}' in prompt
    assert prompt.count("<tool_response>") == 2 and '{"temp": 18}' in prompt
    assert f"{ERROR_RESULT_PREFIX}service down" in prompt
    assert prompt.index("</tool_response>") < prompt.index("Summarise, please.")
    assert "I should look both up." not in prompt


def test_tool_blocks_on_a_template_without_a_convention_are_written_as_text(client):
    history = [
        *ASK,
        {"role": "assistant", "content": [TOOL_USE]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
    ]
    reply = create(client, messages=history)
    assert reply.status == 200, reply.body
