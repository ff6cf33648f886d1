"""`response_format` and the Responses API's `text.format`: replies constrained to JSON by
llguidance, on the random tiny model."""

from __future__ import annotations

import json

import pytest

PERSON = {
    "type": "object",
    # A random model would rarely close an unbounded string: bound it so every reply ends.
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PROSE = [{"role": "user", "content": "Tell me a long story about a person, in prose."}]


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}


def _check_person(text: str) -> None:
    person = json.loads(text)
    assert set(person) == {"name", "age"}
    assert isinstance(person["name"], str)
    assert isinstance(person["age"], int) and not isinstance(person["age"], bool)


@pytest.fixture
def json_client(make_client):
    return make_client(context_size=1024, n_predict=400)


@pytest.mark.parametrize("seed", range(4))
def test_json_schema_reply_validates(json_client, seed):
    body = {"messages": PROSE, "response_format": _schema_format(PERSON), "seed": seed}
    reply = json_client.post("/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    _check_person(choice["message"]["content"])


def test_json_schema_stream_validates(json_client):
    body = {"messages": PROSE, "response_format": _schema_format(PERSON), "stream": True}
    events = json_client.post("/v1/chat/completions", body).events()
    chunks = [e for e in events[:-1] if e["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    _check_person(text)


def test_json_object_parses_as_object(json_client):
    body = {"messages": PROSE, "response_format": {"type": "json_object"}, "n": 2, "seed": 2}
    reply = json_client.post("/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    for choice in reply.json()["choices"]:
        assert choice["finish_reason"] == "stop"
        assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_completions_json_schema(json_client):
    body = {"prompt": "Once upon a time", "response_format": _schema_format(PERSON)}
    reply = json_client.post("/v1/completions", body)
    assert reply.status == 200, reply.body
    _check_person(reply.json()["choices"][0]["text"])


def test_max_tokens_cut_is_length(json_client):
    body = {"messages": PROSE, "response_format": {"type": "json_object"}, "max_tokens": 2}
    choice = json_client.post("/v1/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"].startswith("{")


def test_text_format_leaves_generation_unchanged(client):
    body = {"messages": PROSE, "temperature": 0}
    plain = client.post("/v1/chat/completions", body).json()["choices"][0]
    text = client.post("/v1/chat/completions", {**body, "response_format": {"type": "text"}})
    assert text.json()["choices"][0] == plain


@pytest.mark.parametrize(
    "response_format",
    [
        _schema_format({"type": "string", "pattern": "[a-"}),
        _schema_format({"type": "object", "properties": {"id": {"pattern": "("}}}),
        {"type": "json_schema"},
        {"type": "json_object", "json_schema": {"name": "x", "schema": {}}},
    ],
)
def test_unenforceable_format_is_400(client, response_format):
    for path, body in [
        ("/v1/chat/completions", {"messages": PROSE}),
        ("/v1/completions", {"prompt": "x"}),
    ]:
        reply = client.post(path, {**body, "response_format": response_format})
        assert reply.status == 400, reply.body
        assert reply.json()["error"]["param"].startswith("response_format")


def _text_format(schema: dict) -> dict:
    return {"type": "json_schema", "name": "person", "schema": schema, "strict": True}


def _reply_text(response: dict) -> str:
    return response["output"][0]["content"][0]["text"]


@pytest.mark.parametrize("prompt", ["Tell me a long story.", "Who are you?"])
def test_responses_json_schema_reply_validates(json_client, prompt):
    text_format = _text_format(PERSON)
    body = {"input": prompt, "text": {"format": text_format}}
    reply = json_client.post("/v1/responses", body)
    assert reply.status == 200, reply.body
    response = reply.json()
    assert response["status"] == "completed"
    assert response["text"] == {"format": text_format}
    _check_person(_reply_text(response))


def test_responses_json_schema_stream_validates(json_client):
    text_format = _text_format(PERSON)
    body = {"input": "Tell me a long story.", "text": {"format": text_format}, "stream": True}
    reply = json_client.post("/v1/responses", body)
    assert reply.status == 200, reply.body
    blocks = [block for block in reply.body.decode().split("\n\n") if block]
    events = [json.loads(block.split("\ndata: ")[1]) for block in blocks]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    final = events[-1]
    assert final["type"] == "response.completed"
    assert final["response"]["text"]["format"]["name"] == "person"
    _check_person("".join(deltas))
    assert _reply_text(final["response"]) == "".join(deltas)


def test_responses_json_object_parses_as_object(json_client):
    body = {
        "input": "Tell me a story.",
        "temperature": 0,
        "text": {"format": {"type": "json_object"}},
    }
    response = json_client.post("/v1/responses", body).json()
    assert response["status"] == "completed"
    assert response["text"] == {"format": {"type": "json_object"}}
    assert isinstance(json.loads(_reply_text(response)), dict)


def test_responses_text_format_leaves_generation_unchanged(client):
    body = {"input": "Tell me a story.", "temperature": 0, "max_output_tokens": 8}
    plain = client.post("/v1/responses", body).json()
    text = client.post("/v1/responses", {**body, "text": {"format": {"type": "text"}}}).json()
    assert _reply_text(text) == _reply_text(plain)
    assert plain["text"] == text["text"] == {"format": {"type": "text"}}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "[a-"},
        {"type": "object", "properties": {"id": {"pattern": "("}}},
    ],
)
def test_responses_unenforceable_format_is_400(client, schema):
    for stream in (False, True):
        body = {"input": "x", "text": {"format": _text_format(schema)}, "stream": stream}
        reply = client.post("/v1/responses", body)
        assert reply.status == 400, reply.body
        error = reply.json()["error"]
        assert error["param"] == "text.format" and error["message"].startswith("text.format")
