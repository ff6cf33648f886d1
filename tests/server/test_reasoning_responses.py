"""Reasoning through `/v1/responses`: the reasoning item before the message, its streamed
events in order, usage, and reasoning items sent back as input."""

from __future__ import annotations

from reasoning_clients import ANSWER, REASONING
from test_responses_api import named_events

RESPONSES = "/v1/responses"
REASONING_ORDER = [
    "response.output_item.added",
    "response.content_part.added",
    "response.reasoning_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
MESSAGE_ORDER = [
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def create(client, **fields):
    reply = client.post(RESPONSES, {"input": "Hi", "temperature": 0, **fields})
    assert reply.status == 200, reply.body
    return reply


def test_a_reasoning_item_precedes_the_message(make_thinking_client):
    response = create(make_thinking_client()).json()
    reasoning, message = response["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["content"] == [{"type": "reasoning_text", "text": REASONING}]
    assert reasoning["summary"] == []
    assert message["type"] == "message"
    assert message["content"][0]["text"] == ANSWER
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 4}


def test_without_reasoning_only_the_message(make_thinking_client):
    response = create(make_thinking_client(reasoning_format="none")).json()
    (message,) = response["output"]
    assert message["content"][0]["text"] == "Plan</think>OK"
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}


def test_legacy_format_gives_the_reasoning_item_and_the_answer(make_thinking_client):
    client = make_thinking_client(reasoning_format="deepseek-legacy")
    for response in (create(client).json(), stream_final(client)):
        reasoning, message = response["output"]
        assert reasoning["content"][0]["text"] == REASONING
        assert message["content"][0]["text"] == ANSWER


def stream_final(client) -> dict:
    (final,) = [
        d for n, d in named_events(create(client, stream=True).body) if n == "response.completed"
    ]
    return final["response"]


def test_a_budget_applies(make_thinking_client):
    response = create(make_thinking_client(reasoning_budget=1)).json()
    reasoning, message = response["output"]
    assert reasoning["content"][0]["text"] == REASONING[:1]
    assert message["content"][0]["text"] == ANSWER


def test_streamed_events_in_order(make_thinking_client):
    client = make_thinking_client()
    full = create(client).json()
    events = named_events(create(client, stream=True).body)
    names = [name for name, _ in events]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    deltas = ("response.reasoning_text.delta", "response.output_text.delta")
    assert [n for n in names if n not in deltas] == [
        "response.created",
        "response.in_progress",
        *REASONING_ORDER,
        *MESSAGE_ORDER,
        "response.completed",
    ]
    last_reasoning = max(i for i, n in enumerate(names) if n == deltas[0])
    assert last_reasoning < names.index(deltas[1])
    by_name = {}
    for name, data in events:
        by_name.setdefault(name, []).append(data)
    thoughts = by_name["response.reasoning_text.delta"]
    assert "".join(d["delta"] for d in thoughts) == REASONING
    texts = by_name["response.output_text.delta"]
    assert "".join(d["delta"] for d in texts) == ANSWER
    assert by_name["response.reasoning_text.done"][0]["text"] == REASONING
    final = by_name["response.completed"][0]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    reasoning_id, message_id = (item["id"] for item in final["output"])
    assert {(d["output_index"], d["item_id"]) for d in thoughts} == {(0, reasoning_id)}
    assert {(d["output_index"], d["item_id"]) for d in texts} == {(1, message_id)}
    assert [item["type"] for item in full["output"]] == ["reasoning", "message"]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 4
    assert client.get(f"{RESPONSES}/{final['id']}").json() == final


def test_output_sent_back_with_its_reasoning_item(make_thinking_client):
    client = make_thinking_client()
    first = create(client, store=False).json()
    follow_up = [
        {"role": "user", "content": "Hi"},
        *first["output"],
        {"role": "user", "content": "And?"},
    ]
    second = create(client, input=follow_up).json()
    assert second["output"][-1]["content"][0]["text"] == ANSWER
    stored = create(client).json()
    chained = create(client, input="And?", previous_response_id=stored["id"]).json()
    assert chained["status"] == "completed"
