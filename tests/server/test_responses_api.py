"""`/v1/responses` in-process on the tiny GGUF model: shapes, limits, store, stream, errors."""

import json

import pytest

from mlxcel_server.responses_api.objects import ResponseObject
from mlxcel_server.responses_api.store import ResponseStore, StoredResponse
from mlxcel_server.schemas import ChatMessage

RESPONSES = "/v1/responses"
OUTPUT_YO = {"type": "output_text", "text": "yo"}
STREAM_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def named_events(body: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE block."""
    events = []
    for block in body.decode().split("\n\n"):
        if block:
            name_line, data_line = block.split("\n")
            events.append((name_line.removeprefix("event: "), json.loads(data_line[6:])))
    return events


def test_response_shape_and_usage(client):
    reply = client.post(RESPONSES, {"input": "hello", "temperature": 0, "max_output_tokens": 20})
    body = reply.json()
    assert reply.status == 200 and body["id"].startswith("resp_")
    assert body["object"] == "response" and body["model"] == "tiny" and body["store"] is True
    assert isinstance(body["created_at"], int)
    (message,) = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["id"].startswith("msg_") and message["status"] == body["status"]
    (part,) = message["content"]
    assert part["type"] == "output_text" and part["annotations"] == []
    usage = body["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0


def test_max_output_tokens_ends_incomplete(client):
    body = client.post(RESPONSES, {"input": "hello", "max_output_tokens": 5}).json()
    assert body["status"] == "incomplete" and body["output"][0]["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == 5


def test_instructions_and_message_items_render_through_the_template(client, tiny_loaded):
    items = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "role": "assistant", "content": [OUTPUT_YO]},
        {"role": "user", "content": "and?"},
    ]
    body = client.post(RESPONSES, {"input": items, "instructions": "sys", "store": False}).json()
    expected = tiny_loaded.tokenizer.encode_chat(
        [
            {"role": "system", "content": "sys"},
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "and?"},
        ]
    )
    assert body["usage"]["input_tokens"] == len(expected)


def test_store_previous_response_id_and_get(client, tiny_loaded):
    first = client.post(RESPONSES, {"input": "hello", "instructions": "sys"}).json()
    assert client.get(f"{RESPONSES}/{first['id']}").json() == first
    assert client.get(f"/responses/{first['id']}").status == 200
    second = client.post(RESPONSES, {"input": "again", "previous_response_id": first["id"]})
    reply_text = first["output"][0]["content"][0]["text"]
    # The earlier instructions are not carried over; its input and output are.
    conversation = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": reply_text},
        {"role": "user", "content": "again"},
    ]
    expected = tiny_loaded.tokenizer.encode_chat(conversation)
    assert second.json()["usage"]["input_tokens"] == len(expected)
    assert second.json()["previous_response_id"] == first["id"]


def test_unstored_and_unknown_ids(client):
    unstored = client.post(RESPONSES, {"input": "hello", "store": False}).json()
    reply = client.get(f"{RESPONSES}/{unstored['id']}")
    assert reply.status == 404
    assert reply.json()["error"]["type"] == "not_found_error"
    assert client.get(f"{RESPONSES}/resp_missing").status == 404
    reply = client.post(RESPONSES, {"input": "x", "previous_response_id": "resp_missing"})
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "previous_response_id"


def test_stream_event_order_and_text(client):
    fields = {"input": "hello", "temperature": 0, "max_output_tokens": 6}
    full = client.post(RESPONSES, fields).json()
    reply = client.post(RESPONSES, {**fields, "stream": True})
    assert reply.headers["Content-Type"].startswith("text/event-stream")
    events = named_events(reply.body)
    assert [data["type"] for _, data in events] == [name for name, _ in events]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
    assert deltas and [n for n in names if n != "response.output_text.delta"] == [
        *STREAM_ORDER,
        "response.incomplete",
    ]
    text = full["output"][0]["content"][0]["text"]
    assert "".join(deltas) == text
    final = events[-1][1]["response"]
    assert final["status"] == "incomplete"
    # The second request reuses the first one's full prompt blocks.
    first_usage, usage = dict(full["usage"]), dict(final["usage"])
    assert first_usage.pop("input_tokens_details")["cached_tokens"] == 0
    assert usage.pop("input_tokens_details")["cached_tokens"] > 0
    assert usage == first_usage
    assert final["output"][0]["content"][0]["text"] == text
    assert events[0][1]["response"]["status"] == "in_progress"
    assert client.get(f"{RESPONSES}/{final['id']}").json() == final


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 2}, "top_p"),
        ({"input": []}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, None),
    ],
)
def test_unsupported_or_invalid_fields_are_400s(client, fields, param):
    reply = client.post(RESPONSES, {"input": "hello", **fields})
    assert reply.status == 400, reply.body
    if param is not None:
        assert reply.json()["error"]["param"] == param


def test_hosted_service_fields_are_taken_without_effect(client):
    greedy = {"input": "hello", "temperature": 0, "max_output_tokens": 6}
    plain = client.post(RESPONSES, greedy).json()["output"][0]["content"][0]["text"]
    hosted = {
        "user": "user-1",
        "safety_identifier": "hash-of-user-1",
        "prompt_cache_key": "conversation-7",
        "metadata": {"session": "7"},
        "service_tier": "default",
        "truncation": "disabled",
    }
    reply = client.post(RESPONSES, {**greedy, **hosted})
    assert reply.status == 200, reply.body
    assert reply.json()["output"][0]["content"][0]["text"] == plain


@pytest.mark.parametrize(
    ("fields", "param", "text"),
    [
        ({"truncation": "auto"}, "truncation", "drops no input items"),
        ({"truncation": "middle"}, "truncation", "'disabled'"),
        ({"metadata": {"k": 2}}, "metadata.k", "string"),
        ({"user": None, "service_tier": "flex"}, "service_tier", "one service tier"),
        ({"modalities": ["text"]}, "modalities", "does not implement"),
    ],
)
def test_hosted_service_fields_of_the_wrong_value_are_400s(client, fields, param, text):
    reply = client.post(RESPONSES, {"input": "hello", **fields})
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["param"] == param and text in error["message"]


def test_plain_text_format_and_empty_input_work(client):
    body = {"input": "hello", "text": {"format": {"type": "text"}}, "max_output_tokens": 2}
    assert client.post(RESPONSES, body).status == 200
    assert client.post(RESPONSES, {"input": "", "max_output_tokens": 2}).status in (200, 400)
    assert client.post(RESPONSES, {"input": "hello", "max_output_tokens": 2}).status == 200


def test_store_evicts_the_least_recently_used():
    store = ResponseStore(capacity=2)

    def entry(response_id: str) -> StoredResponse:
        response = ResponseObject(
            id=response_id, created_at=0, status="completed", model="m", output=[], store=True
        )
        return StoredResponse(response, (ChatMessage(role="user", content=response_id),))

    store.put(entry("a"))
    store.put(entry("b"))
    assert store.get("a") is not None
    store.put(entry("c"))
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    with pytest.raises(ValueError, match="capacity"):
        ResponseStore(capacity=0)
