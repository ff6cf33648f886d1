"""Thinking blocks from `/v1/messages` on a reasoning model: the collected and streamed
shapes, the request's `thinking` field as the reasoning budget, the server's reasoning
flags without it, and the official `anthropic` client reading both shapes."""

from __future__ import annotations

import anthropic
import httpx2
import pytest
from reasoning_clients import ANSWER, ASK, REASONING
from test_anthropic_messages import COUNT, MESSAGES, WEATHER_TOOL, named_events

THOUGHT = {"type": "thinking", "thinking": REASONING, "signature": ""}
TOOL_REPLY = (
    "Look it up.</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


def create(client, **fields):
    body = {"model": "tiny", "max_tokens": 16, "messages": ASK, "temperature": 0, **fields}
    reply = client.post(MESSAGES, body)
    assert reply.status == 200, reply.body
    return reply


def test_a_reply_starts_with_its_thinking_block(make_thinking_client):
    body = create(make_thinking_client()).json()
    assert body["content"] == [THOUGHT, {"type": "text", "text": ANSWER}]
    assert body["stop_reason"] == "end_turn"
    assert set(body["usage"]) == {"input_tokens", "output_tokens", "cache_read_input_tokens"}
    # P, l, a, n, </think>, O, K, <|im_end|>: reasoning counts as output, as Anthropic's does.
    assert body["usage"]["output_tokens"] == 8


def test_streamed_thinking_is_a_block_before_the_text(make_thinking_client):
    events = named_events(create(make_thinking_client(), stream=True).body)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    starts = [data for name, data in events if name == "content_block_start"]
    assert [(s["index"], s["content_block"]) for s in starts] == [
        (0, {"type": "thinking", "thinking": "", "signature": ""}),
        (1, {"type": "text", "text": ""}),
    ]
    deltas = [(d["index"], d["delta"]) for n, d in events if n == "content_block_delta"]
    thinking = [delta for index, delta in deltas if index == 0]
    assert "".join(d["thinking"] for d in thinking[:-1]) == REASONING
    assert {d["type"] for d in thinking[:-1]} == {"thinking_delta"}
    assert thinking[-1] == {"type": "signature_delta", "signature": ""}
    assert "".join(delta["text"] for index, delta in deltas if index == 1) == ANSWER
    # The thinking block closes before the text block opens.
    edges = [
        (n, d["index"]) for n, d in events if n in ("content_block_start", "content_block_stop")
    ]
    assert edges == [
        ("content_block_start", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
    ]


@pytest.mark.parametrize("budget", [1, 3])
def test_enabled_thinking_sets_the_budget(make_thinking_client, budget):
    # The request's budget wins over the server's, even a server that turns reasoning off.
    client = make_thinking_client(reasoning_budget=0)
    thinking = {"type": "enabled", "budget_tokens": budget}
    body = create(client, thinking=thinking).json()
    assert body["content"] == [
        {**THOUGHT, "thinking": REASONING[:budget]},
        {"type": "text", "text": ANSWER},
    ]


def test_disabled_thinking_switches_the_template_off(make_replay_client):
    client, engine = make_replay_client("Straight answer.")
    body = create(client, thinking={"type": "disabled"}).json()
    assert body["content"] == [{"type": "text", "text": "Straight answer."}]
    prompt = client.post("/detokenize", {"tokens": list(engine.prompts[-1])}).json()["content"]
    assert prompt.endswith("<think>\n\n</think>\n\n")
    counted = {"model": "tiny", "messages": ASK}
    on = client.post(COUNT, counted).json()["input_tokens"]
    off = client.post(COUNT, {**counted, "thinking": {"type": "disabled"}}).json()["input_tokens"]
    assert off == len(engine.prompts[-1]) > on


def test_without_the_field_the_servers_reasoning_flags_apply(make_thinking_client):
    body = create(make_thinking_client(reasoning_budget=2)).json()
    assert body["content"][0] == {**THOUGHT, "thinking": "Pl"}
    legacy = create(make_thinking_client(reasoning_format="deepseek-legacy")).json()
    assert legacy["content"] == [THOUGHT, {"type": "text", "text": ANSWER}]
    plain = make_thinking_client(reasoning_format="none")
    assert create(plain).json()["content"] == [{"type": "text", "text": "Plan</think>OK"}]
    thinking = {"type": "enabled", "budget_tokens": 8}
    assert create(plain, thinking=thinking).json()["content"][0] == THOUGHT


def test_tool_calls_follow_the_thinking_and_are_read_from_the_answer(make_replay_client):
    client, _ = make_replay_client(TOOL_REPLY)
    fields = {"tools": [WEATHER_TOOL], "max_tokens": 64}
    thought, call = create(client, **fields).json()["content"]
    assert thought == {**THOUGHT, "thinking": "Look it up."}
    assert (call["type"], call["input"]) == ("tool_use", {"city": "Paris"})
    events = named_events(create(client, stream=True, **fields).body)
    starts = [data for name, data in events if name == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [
        (0, "thinking"),
        (1, "tool_use"),
    ]
    assert [data["index"] for name, data in events if name == "content_block_stop"] == [0, 1]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


class AppTransport(httpx2.BaseTransport):
    """Hands the official client's requests (it speaks through `httpx2`) to the in-process
    app."""

    def __init__(self, client) -> None:
        self.client = client

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        reply = self.client.request(
            request.method,
            request.url.path,
            data=request.read(),
            headers=dict(request.headers),
        )
        return httpx2.Response(
            reply.status, headers=list(reply.headers.items()), content=reply.body
        )


def test_the_official_client_reads_thinking_blocks(make_thinking_client):
    http_client = httpx2.Client(transport=AppTransport(make_thinking_client()))
    client = anthropic.Anthropic(
        api_key="unused", base_url="http://mlxcel", http_client=http_client
    )
    fields = {"model": "tiny", "max_tokens": 16, "messages": ASK}
    fields["thinking"] = {"type": "enabled", "budget_tokens": 8}
    message = client.messages.create(**fields)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert (message.content[0].thinking, message.content[0].signature) == (REASONING, "")
    assert message.content[1].text == ANSWER
    with client.messages.stream(**fields) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert {"thinking", "signature", "text"} <= set(kinds)
    # The stream's accumulated text block is the client's ParsedTextBlock subclass.
    assert [block.model_dump(exclude={"parsed_output"}) for block in streamed.content] == [
        block.model_dump() for block in message.content
    ]
    assert streamed.stop_reason == message.stop_reason == "end_turn"
