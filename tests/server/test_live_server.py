"""A real `mlxcel serve` process (`live_server.LiveServer`) on a free loopback port, driven by
the `openai` client and raw HTTP. All traffic goes to 127.0.0.1; every wait is bounded."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from factories import HERMES_TEMPLATE, write_gguf_model
from live_server import LiveServer

TIMEOUT = httpx.Timeout(60.0)


@pytest.fixture(scope="module")
def tiny_server(tiny_gguf):
    # A context far larger than the tiny model needs, so a request can run for a long time.
    server = LiveServer(
        "-m", str(tiny_gguf), "-c", "100000", "-n", "16", "-a", "tiny", "--metrics"
    )  # fmt: skip
    yield server
    server.stop()


def test_openai_client_chat_completions_and_streaming(tiny_server):
    client = tiny_server.client()
    messages = [{"role": "user", "content": "hello"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, temperature=0)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 16
    stream = client.chat.completions.create(
        model="tiny", messages=messages, temperature=0, stream=True
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == chat.choices[0].message.content
    completion = client.completions.create(model="tiny", prompt="hello", max_tokens=3)
    assert completion.usage.completion_tokens == 3
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_openai_client_reads_logprobs_and_metrics_count_them(tiny_server):
    client = tiny_server.client()
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0,
        max_tokens=4,
        logprobs=True,
        top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == 4 and all(len(entry.top_logprobs) == 3 for entry in content)
    assert all(entry.token == entry.top_logprobs[0].token for entry in content)
    metrics = httpx.get(tiny_server.url + "/metrics", timeout=TIMEOUT).text
    assert "llamacpp:tokens_predicted_total" in metrics


def test_openai_client_sees_typed_errors(tiny_server):
    client = tiny_server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt="x", max_tokens=-3)
    assert caught.value.body["param"] == "max_tokens"


def test_openai_client_retrieves_the_model_under_any_name(tiny_server):
    client = tiny_server.client()
    for name in ("tiny", "gpt-4o-mini"):
        model = client.models.retrieve(name)
        assert model.id == "tiny" and model.object == "model" and model.owned_by == "mlxcel"


def test_openai_client_sends_hosted_service_fields(tiny_server):
    client = tiny_server.client()
    fields = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    plain = client.chat.completions.create(**fields, max_tokens=5).choices[0].message.content
    hosted = client.chat.completions.create(
        **fields,
        max_tokens=5,
        user="user-1",
        metadata={"session": "7"},
        store=False,
        service_tier="auto",
        prompt_cache_key="conversation-7",
        safety_identifier="hash-of-user-1",
        modalities=["text"],
    )
    assert hosted.choices[0].message.content == plain
    refused = [({"store": True}, "store"), ({"modalities": ["text", "audio"]}, "modalities")]
    for extra, param in refused:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**fields, max_tokens=1, **extra)
        assert caught.value.body["param"] == param
    response = client.responses.create(
        model="tiny", input="hi", max_output_tokens=2, user="user-1", truncation="disabled"
    )
    assert response.status == "incomplete"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tiny", input="hi", truncation="auto")
    assert caught.value.body["param"] == "truncation"


def test_raw_http_error_cases(tiny_server):
    url = tiny_server.url + "/v1/chat/completions"
    assert httpx.post(url, content=b"{oops", headers={"Content-Type": "application/json"},
                      timeout=TIMEOUT).status_code == 400  # fmt: skip
    assert httpx.post(url, content=b"{}", headers={"Content-Type": "text/plain"},
                      timeout=TIMEOUT).status_code == 415  # fmt: skip
    reply = httpx.post(url, json={"messages": [], "tool_choice": "required"}, timeout=TIMEOUT)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tool_choice"


def test_a_disconnect_cancels_its_request(tiny_server):
    # Without a limit this request would decode until the 100000-token context is full.
    body = {"prompt": "hello", "max_tokens": 90000, "stream": True}
    with httpx.stream("POST", tiny_server.url + "/v1/completions", json=body, timeout=TIMEOUT) as r:
        lines = r.iter_lines()
        assert sum(1 for _, line in zip(range(5), lines, strict=False) if line) > 0
    # Requests run one at a time: this one finishes quickly only if the first was cancelled.
    start = time.monotonic()
    reply = httpx.post(
        tiny_server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=TIMEOUT
    )
    assert reply.status_code == 200
    assert time.monotonic() - start < 20


@pytest.mark.slow
def test_smollm2_answers_paris_and_streams_whole_characters(smollm2_server):
    with smollm2_server.stderr_on_failure():
        client = smollm2_server.client()
        question = "What is the capital of France? Answer in one sentence."
        answer = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": question}],
            temperature=0,
            max_tokens=16,
        )
        assert "Paris" in answer.choices[0].message.content
        text = "🦙🔥 日本語テキスト ďábel 👩‍👩‍👧"
        messages = [{"role": "user", "content": f"Repeat exactly: {text}"}]
        fields = {"messages": messages, "temperature": 0, "max_tokens": 40}
        full = client.chat.completions.create(model="smollm2", **fields)
        deltas = [
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(model="smollm2", stream=True, **fields)
            if chunk.choices
        ]
        reply = full.choices[0].message.content
        assert "".join(deltas) == reply
        # Whole characters only: a replacement character appears in a delta only where the
        # model's own reply has one (invalid bytes it generated), never from a split.
        assert sum(delta.count("\ufffd") for delta in deltas) == reply.count("\ufffd"), reply
        assert "🦙" in reply, reply


def test_openai_client_responses_streaming_and_store(tiny_server):
    client = tiny_server.client()
    first = client.responses.create(model="tiny", input="hello", max_output_tokens=5)
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    assert client.responses.retrieve(first.id).output_text == first.output_text
    events = list(
        client.responses.create(
            model="tiny", input="again", previous_response_id=first.id, temperature=0, stream=True
        )
    )
    names = [event.type for event in events]
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == events[-1].response.output_text
    assert events[-1].response.usage.input_tokens > first.usage.input_tokens
    assert [event.sequence_number for event in events] == list(range(len(events)))
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing")


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_openai_client_sends_tools_and_tool_results(tmp_path):
    model = write_gguf_model(tmp_path / "hermes.gguf", chat_template=HERMES_TEMPLATE)
    server = LiveServer("-m", str(model), "-n", "8")
    try:
        client = server.client()
        question = [{"role": "user", "content": "Weather in Paris?"}]
        first = client.chat.completions.create(
            model="hermes.gguf", messages=question, tools=[WEATHER_TOOL], temperature=0
        )
        assert first.choices[0].finish_reason in ("stop", "length", "tool_calls")
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        follow_up = [
            *question,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        ]
        chunks = list(
            client.chat.completions.create(
                model="hermes.gguf", messages=follow_up, tools=[WEATHER_TOOL], stream=True
            )
        )
        assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
        # A random model still calls when it must: the grammar writes the markup.
        forced = client.chat.completions.create(
            model="hermes.gguf",
            messages=question,
            tools=[WEATHER_TOOL],
            tool_choice="required",
            max_tokens=64,
        )
        assert forced.choices[0].message.tool_calls[0].function.name == "get_weather"
    finally:
        assert server.stop() == 0, server.stderr()


# Last in the module: it stops the module's server, after the requests above (one of them
# cancelled by its client).
def test_sigterm_shuts_down_cleanly(tiny_server):
    assert tiny_server.stop() == 0, tiny_server.stderr()
