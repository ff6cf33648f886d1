"""`logprobs` on chat completions and completions, streamed and not."""

import pytest

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
GREEDY = {"temperature": 0, "max_tokens": 5}


def chat(client, **fields):
    return client.post(CHAT, {"messages": HELLO, **GREEDY, **fields})


def assert_sorted_with_chosen_on_top(entry, count):
    tops = entry["top_logprobs"]
    assert len(tops) == count
    values = [top["logprob"] for top in tops]
    assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
    assert tops[0]["token"] == entry["token"]
    assert tops[0]["logprob"] == pytest.approx(entry["logprob"])
    assert entry["bytes"] == list(entry["token"].encode())


def test_chat_logprobs_one_sorted_entry_per_token(client):
    body = chat(client, logprobs=True, top_logprobs=3).json()
    (choice,) = body["choices"]
    content = choice["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"] == 5
    for entry in content:
        assert_sorted_with_chosen_on_top(entry, 3)
    assert "".join(entry["token"] for entry in content) == choice["message"]["content"]


def test_chat_logprobs_without_top_logprobs_and_absent_by_default(client):
    (choice,) = chat(client, logprobs=True).json()["choices"]
    assert all(entry["top_logprobs"] == [] for entry in choice["logprobs"]["content"])
    assert chat(client).json()["choices"][0]["logprobs"] is None
    assert chat(client, logprobs=False).json()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": 2}, "logprobs"),
    ],
)
def test_chat_logprobs_errors_name_the_field(client, fields, param):
    reply = chat(client, **fields)
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["param"] == param


def test_streamed_chat_chunks_carry_their_entries(client):
    full = chat(client, logprobs=True, top_logprobs=2).json()["choices"][0]["logprobs"]
    events = chat(client, logprobs=True, top_logprobs=2, stream=True).events()[:-1]
    streamed = [
        e
        for c in events
        if c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert [e["token"] for e in streamed] == [e["token"] for e in full["content"]]
    assert [e["logprob"] for e in streamed] == pytest.approx(
        [e["logprob"] for e in full["content"]]
    )
    for entry in streamed:
        assert_sorted_with_chosen_on_top(entry, 2)


def test_completion_logprobs_have_the_legacy_shape(client):
    body = client.post("/v1/completions", {"prompt": "hi", **GREEDY, "logprobs": 2}).json()
    (choice,) = body["choices"]
    logprobs = choice["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == 5
    assert "".join(logprobs["tokens"]) == choice["text"]
    offsets = [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(5)]
    assert logprobs["text_offset"] == offsets
    for token, logprob, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert 1 <= len(top) <= 3 and max(top.values()) == pytest.approx(logprob)
        assert top[token] == pytest.approx(logprob)


def test_streamed_completion_logprobs_continue_the_offsets(client):
    fields = {"prompt": "hi", **GREEDY, "logprobs": 1}
    full = client.post("/v1/completions", fields).json()["choices"][0]["logprobs"]
    events = client.post("/v1/completions", {**fields, "stream": True}).events()[:-1]
    parts = [c["choices"][0]["logprobs"] for c in events if c["choices"][0]["logprobs"]]
    assert [p["tokens"][0] for p in parts] == full["tokens"]
    assert [p["text_offset"][0] for p in parts] == full["text_offset"]


@pytest.mark.parametrize(
    "fields",
    [{"logprobs": 6}, {"logprobs": -1}, {"logprobs": True}, {"logprobs": 1, "echo": True}],
)
def test_completion_logprobs_errors_name_the_field(client, fields):
    reply = client.post("/v1/completions", {"prompt": "hi", "max_tokens": 2, **fields})
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["param"] == "logprobs"
