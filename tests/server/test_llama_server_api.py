"""llama-server's own API on the tiny model: `POST /completion` (its request and reply
fields, streamed or not, on the same engine path as `/v1/completions`), `n_predict`,
`grammar` (GBNF) and `json_schema` on every completion endpoint, and `/tokenize`'s
`with_pieces`."""

import json

import pytest

COMPLETION = "/completion"
GREEDY = {"temperature": 0, "ignore_eos": True}
YES_NO = 'root ::= "yes" | "no"'


def complete(client, **fields):
    return client.post(COMPLETION, {"prompt": "Hello", **GREEDY, **fields})


def test_completion_equals_v1_completions_greedy(client):
    native = complete(client, n_predict=5, return_tokens=True).json()
    openai = client.post("/v1/completions", {"prompt": "Hello", "max_tokens": 5, **GREEDY})
    assert native["content"] == openai.json()["choices"][0]["text"]
    assert native["stop"] is True and native["stop_type"] == "limit"
    assert native["tokens_predicted"] == 5 and len(native["tokens"]) == 5
    assert native["tokens_evaluated"] == openai.json()["usage"]["prompt_tokens"]
    assert native["model"] == "tiny" and native["prompt"] == "Hello"
    assert native["timings"]["prompt_n"] > 0 and native["stopping_word"] == ""
    assert complete(client, n_predict=5).json()["tokens"] == []


def test_streamed_completion_adds_up_to_the_reply(client):
    whole = complete(client, n_predict=6).json()
    reply = complete(client, n_predict=6, stream=True)
    assert reply.headers["Content-Type"].startswith("text/event-stream")
    assert "[DONE]" not in reply.body.decode()
    events = reply.events()
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert sum(len(e["tokens"]) for e in events) == 6
    assert events[-1]["tokens_predicted"] == 6 and events[-1]["stop_type"] == "limit"


def test_a_mixed_prompt_of_ids_and_text_is_one_prompt(client):
    ids = client.post("/tokenize", {"content": "Hello"}).json()["tokens"]
    by_text = complete(client, n_predict=3).json()
    mixed = complete(client, prompt=[*ids[:1], "ello"], n_predict=3).json()
    by_ids = complete(client, prompt=ids, n_predict=3).json()
    assert by_ids["content"] == by_text["content"]
    assert mixed["tokens_evaluated"] == len(ids[:1]) + len(
        client.post("/tokenize", {"content": "ello"}).json()["tokens"]
    )


def test_n_probs_reports_the_likeliest_tokens(client):
    probs = complete(client, n_predict=3, n_probs=2).json()["completion_probabilities"]
    assert len(probs) == 3
    for entry in probs:
        assert set(entry) == {"id", "token", "logprob", "bytes", "top_logprobs"}
        assert len(entry["top_logprobs"]) == 2
        # Greedy: the chosen token is the likeliest.
        assert entry["id"] == entry["top_logprobs"][0]["id"]


def test_a_grammar_and_a_stop_word(client):
    reply = complete(client, n_predict=8, grammar=YES_NO, ignore_eos=False).json()
    assert reply["content"] in ("yes", "no") and reply["stop_type"] == "eos"
    grammar = 'root ::= "yes no yes"'
    reply = complete(client, n_predict=8, grammar=grammar, stop=["no"], ignore_eos=False).json()
    assert reply["content"] == "yes " and reply["stop_type"] == "word"
    assert reply["stopping_word"] == "no"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": [10**9]}, "prompt[0]"),
        ({"prompt": []}, "prompt"),
        ({"n_predict": -2}, "n_predict"),
        ({"mirostat": 2}, "mirostat"),
        ({"grammar": 'root ::= ("a" | '}, "grammar"),
        ({"grammar": "root ::= missing"}, "grammar"),
        ({"grammar": YES_NO, "json_schema": {}}, "json_schema"),
    ],
)
def test_bad_completion_fields_are_400_naming_them(client, fields, param):
    reply = complete(client, **fields)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["param"] == param and "\n" not in error["message"]


def test_n_predict_is_the_token_limit_of_chat_and_completions(client):
    chat = {"messages": [{"role": "user", "content": "hi"}], "n_predict": 4, **GREEDY}
    assert client.post("/v1/chat/completions", chat).json()["usage"]["completion_tokens"] == 4
    body = {"prompt": "hi", "n_predict": 3, "max_tokens": 9, **GREEDY}
    assert client.post("/v1/completions", body).json()["usage"]["completion_tokens"] == 3


def test_json_schema_and_grammar_on_the_openai_endpoints(client):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    body = {"prompt": "x", "max_tokens": 40, "json_schema": schema, "temperature": 0}
    text = client.post("/v1/completions", body).json()["choices"][0]["text"]
    assert isinstance(json.loads(text)["ok"], bool)
    chat = {"messages": [{"role": "user", "content": "hi"}], "grammar": YES_NO, "max_tokens": 8}
    reply = client.post("/v1/chat/completions", chat).json()
    assert reply["choices"][0]["message"]["content"] in ("yes", "no")
    both = {**chat, "response_format": {"type": "json_object"}}
    assert client.post("/v1/chat/completions", both).status == 400
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    reply = client.post("/v1/chat/completions", {**chat, "tools": [tool]})
    assert reply.status == 400 and reply.json()["error"]["param"] == "grammar"


def test_tokenize_with_pieces(client):
    text = "Hello é"
    plain = client.post("/tokenize", {"content": text}).json()["tokens"]
    pieces = client.post("/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == plain
    data = b"".join(
        p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces
    )
    assert data == text.encode()
    # The tiny vocabulary splits "é" into its two bytes, neither of them text.
    assert pieces[-2:] == [{"id": plain[-2], "piece": [0xC3]}, {"id": plain[-1], "piece": [0xA9]}]
