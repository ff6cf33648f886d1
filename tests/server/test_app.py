"""The app in-process on the tiny GGUF model: shapes, fields, errors."""

import pytest

from mlxcel_core.engine import Engine, EngineConfig

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


def chat(client, **fields):
    return client.post(CHAT, {"messages": HELLO, **fields})


def assert_error(reply, status, param=None, code=None, text=""):
    assert reply.status == status, reply.body
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["code"] == code
    assert text in error["message"]


def test_chat_completion_shape_usage_and_timings(client):
    body = chat(client, temperature=0, max_tokens=4).json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + 4
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert body["timings"]["prompt_n"] == usage["prompt_tokens"]


def test_unversioned_paths_answer_too(client):
    assert client.post("/chat/completions", {"messages": HELLO, "max_tokens": 1}).status == 200
    assert client.post("/completions", {"prompt": "hi", "max_tokens": 1}).status == 200


def test_streamed_chat_equals_the_unstreamed_reply(client):
    fields = {"temperature": 0, "max_tokens": 6}
    full = chat(client, **fields).json()["choices"][0]["message"]["content"]
    events = chat(client, stream=True, stream_options={"include_usage": True}, **fields).events()
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 6
    chunks = events[:-2]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks) == full
    assert [c["choices"][0]["finish_reason"] for c in chunks].count("length") == 1


def test_max_tokens_null_is_absent_and_max_completion_tokens_caps(client):
    assert chat(client, max_tokens=None).json()["usage"]["completion_tokens"] == 8
    body = chat(client, max_completion_tokens=5, max_tokens=7).json()
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_negative_token_limit_is_a_400_naming_it(client, field):
    assert_error(chat(client, **{field: -3}), 400, field)


def test_n_choices_seeds_and_greedy(client):
    greedy = chat(client, n=4, temperature=0).json()["choices"]
    assert [c["index"] for c in greedy] == [0, 1, 2, 3]
    assert len({c["message"]["content"] for c in greedy}) == 1
    seeded = [chat(client, n=4, temperature=1, seed=7, top_k=0, min_p=0).json() for _ in range(2)]
    texts = [[c["message"]["content"] for c in body["choices"]] for body in seeded]
    assert texts[0] == texts[1] and len(set(texts[0])) >= 2
    events = chat(client, n=3, stream=True).events()[:-1]
    finishes = [c["choices"][0]["index"] for c in events if c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1, 2]


def test_stop_string_and_logit_bias_change_the_output(client):
    base = chat(client, temperature=0, max_tokens=8).json()["choices"][0]["message"]["content"]
    stop = base[2:4]
    stopped = chat(client, temperature=0, max_tokens=8, stop=[stop]).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and stop not in stopped["message"]["content"]
    (z,) = client.post("/tokenize", {"content": "z"}).json()["tokens"]
    forced = chat(client, temperature=0, max_tokens=3, logit_bias={"z": 100}).json()
    assert forced["choices"][0]["message"]["content"] == "zzz"
    bans = {str(i): (False if i % 2 else -100) for i in range(263) if i != z}
    banned = chat(client, temperature=1, max_tokens=3, logit_bias=bans).json()
    assert banned["choices"][0]["message"]["content"] == "zzz"


def test_completions_with_prompt_list_n_and_echo(client):
    body = client.post(
        "/v1/completions", {"prompt": ["hello", "x"], "n": 2, "echo": True, "max_tokens": 2}
    ).json()
    assert body["object"] == "text_completion"
    texts = [c["text"] for c in body["choices"]]
    assert [t[:5] for t in texts[:2]] == ["hello"] * 2 and texts[2].startswith("x")
    assert body["usage"]["prompt_tokens"] == sum(
        len(client.post("/tokenize", {"content": p}).json()["tokens"]) for p in ("hello", "x")
    )
    reply = client.post("/v1/completions", {"prompt": "hello", "echo": True, "stream": True})
    events = reply.events()
    assert events[0]["choices"][0]["text"].startswith("hello") and events[-1] == "[DONE]"


def test_completions_take_token_id_prompts_as_openai_does(client):
    ids = client.post("/tokenize", {"content": "hello"}).json()["tokens"]
    greedy = {"temperature": 0, "max_tokens": 3}
    by_text = client.post("/v1/completions", {"prompt": "hello", **greedy}).json()
    by_ids = client.post("/v1/completions", {"prompt": ids, "echo": True, **greedy}).json()
    assert by_ids["choices"][0]["text"] == "hello" + by_text["choices"][0]["text"]
    assert by_ids["usage"] == by_text["usage"]
    # The echo shows what the model read, special tokens included (id 1 is <|im_start|>).
    special = client.post("/v1/completions", {"prompt": [1, *ids], "echo": True, **greedy})
    assert special.json()["choices"][0]["text"].startswith("<|im_start|>hello")
    both = client.post("/v1/completions", {"prompt": [ids, ids], **greedy}).json()
    assert [c["text"] for c in both["choices"]] == [by_text["choices"][0]["text"]] * 2
    assert_error(client.post("/v1/completions", {"prompt": [ids, [10**6]]}), 400, "prompt[1]")
    assert_error(client.post("/v1/completions", {"prompt": [10**6]}), 400, "prompt")
    assert_error(client.post("/v1/completions", {"prompt": [[]]}), 400, "prompt[0]")


def test_more_prompts_than_the_queue_holds_names_the_prompts(make_client, tiny_loaded):
    client = make_client(engine=Engine(tiny_loaded.model, EngineConfig(max_waiting=2)))
    reply = client.post("/v1/completions", {"prompt": ["a", "b", "c"], "max_tokens": 1})
    assert_error(reply, 400, "prompt", text="3 prompts with n=1 make 3 sequences")
    reply = client.post("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 1})
    assert reply.status == 200


@pytest.mark.parametrize(
    ("fields", "param", "text"),
    [
        ({"tools": [{"type": "function"}]}, "tools[0].function", "required"),
        ({"response_format": {"type": "grammar"}}, "response_format.type", ""),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
        ({"temperature": "hot"}, "temperature", "temperature"),
        ({"top_p": 2}, "top_p", "top_p"),
        ({"n": 0}, "n", "n must be"),
        ({"stop": ""}, "stop", "empty"),
        ({"seed": -2}, "seed", "seed"),
        ({"logit_bias": {"99999": 1}}, "logit_bias", "vocabulary"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
        ({"messages": []}, "messages", "at least one"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]", "tool_call_id"),
        ({"messages": [{"role": "critic", "content": "x"}]}, "messages[0].role", ""),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None, ""),
        ({"messages": [{"role": "user"}]}, "messages[0]", "needs content"),
        ({"messages": [*HELLO, {"role": "assistant"}]}, "messages[1]", "content or tool_calls"),
        ({"min_tokens": -1}, "min_tokens", ">= 0"),
        ({"n_probs": -1}, "n_probs", ">= 0"),
        ({"samplers": ["top_k", "mirostat"]}, "samplers", "unknown sampler name"),
        ({"samplers": "kz"}, "samplers", "unknown sampler letter"),
        ({"t_max_predict_ms": -5}, "t_max_predict_ms", ">= 0"),
        ({"id_slot": -2}, "id_slot", "-1"),
        ({"messages": [{"role": "system", "content": []}]}, "messages[0]", "needs content"),
        ({"logit_bias": {"": 5}}, "logit_bias", "names no token"),
        ({"logit_bias": {"9" * 5000: 5}}, "logit_bias", "is not a token id"),
        ({"logit_bias": {"²": 5}}, "logit_bias", "is not a token id"),
    ],
)
def test_invalid_fields_are_400s_naming_the_field(client, fields, param, text):
    reply = client.post(CHAT, {"messages": HELLO, **fields})
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    if param is not None:
        assert error["param"] == param
    assert text in error["message"]


def test_body_errors(client):
    assert_error(client.post(CHAT, data=b"{", headers={"Content-Type": "application/json"}), 400)
    assert_error(client.post(CHAT, data=b"", headers={"Content-Type": "application/json"}), 400)
    assert_error(client.post(CHAT, data=b"[1]", headers={"Content-Type": "application/json"}), 400)
    assert_error(client.post(CHAT, data=b"{}", headers={"Content-Type": "text/plain"}), 415)
    assert_error(client.post(CHAT, {"prompt": "x"}), 400, "messages")
    json_headers = {"Content-Type": "application/json"}
    lone_surrogate = b'{"messages": [{"role": "user", "content": "\\ud800"}]}'
    assert_error(client.post(CHAT, data=lone_surrogate, headers=json_headers), 400)
    deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert_error(client.post(CHAT, data=deep, headers=json_headers), 400, text="nested too deeply")
    # Python refuses to convert an integer of over 4,300 digits (CVE-2020-10735).
    huge = b'{"messages": [], "max_tokens": ' + b"9" * 4301 + b"}"
    assert_error(client.post(CHAT, data=huge, headers=json_headers), 400, text="not valid JSON")
    assert_error(client.get("/nowhere"), 404)


def test_body_over_the_limit_is_413(make_client):
    small = make_client(max_body_bytes=100)
    assert_error(small.post(CHAT, {"messages": [{"role": "user", "content": "x" * 200}]}), 413)


@pytest.mark.parametrize("name", ["gpt-4o-mini", "tiny", None])
def test_any_model_name_is_served_by_the_one_model(client, name):
    body = {"max_tokens": 1} if name is None else {"model": name, "max_tokens": 1}
    reply = chat(client, **body)
    assert reply.status == 200
    assert reply.json()["model"] == "tiny"


def test_prompt_longer_than_context_is_400_with_both_numbers(make_client):
    small = make_client(context_size=32)
    reply = small.post("/v1/completions", {"prompt": "hello " * 40, "stream": True})
    assert_error(reply, 400, "prompt", "context_length_exceeded", "but the context size is 32")
    assert "text/event-stream" not in reply.headers.get("Content-Type", "")


@pytest.mark.parametrize("prompt", ["", [""], []])
def test_empty_prompts_are_400_and_the_next_request_works(client, prompt):
    assert client.post("/v1/completions", {"prompt": prompt}).status == 400
    assert client.post("/v1/completions", {"prompt": "hi", "max_tokens": 1}).status == 200


def test_empty_user_message_and_text_parts(client):
    assert chat(client, messages=[{"role": "user", "content": ""}], max_tokens=1).status == 200
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": parts},
    ]
    prompt = client.post("/apply-template", {"messages": messages}).json()["prompt"]
    assert prompt.index("sys") < prompt.index("hi") < prompt.index("first\nsecond")


def test_api_key_is_required_except_for_health(make_client):
    secured = make_client(api_keys=("k1", "k2"))
    assert_error(secured.get("/v1/models"), 401, code="invalid_api_key")
    assert_error(secured.get("/v1/models", headers={"Authorization": "Bearer nope"}), 401,
                 code="invalid_api_key")  # fmt: skip
    assert secured.get("/v1/models", headers={"Authorization": "Bearer k2"}).status == 200
    assert secured.get("/health").status == 200


def test_cors_origin_is_echoed_only_when_allowed(make_client):
    cors = make_client(cors_origins=("http://a.example",))
    allowed = cors.get("/health", headers={"Origin": "http://a.example"})
    assert allowed.headers["Access-Control-Allow-Origin"] == "http://a.example"
    other = cors.get("/health", headers={"Origin": "http://b.example"})
    assert "Access-Control-Allow-Origin" not in other.headers


def test_loading_server_answers_503(loading_client):
    loading = loading_client
    assert_error(loading.get("/health"), 503)
    reply = loading.post(CHAT, {"messages": HELLO})
    assert_error(reply, 503)
    assert reply.headers["Retry-After"] == "1"


def test_models_tokenize_detokenize(client):
    (model,) = client.get("/v1/models").json()["data"]
    assert model["id"] == "tiny" and model["object"] == "model"
    tokens = client.post("/tokenize", {"content": "hello"}).json()["tokens"]
    assert client.post("/detokenize", {"tokens": tokens}).json() == {"content": "hello"}
    assert_error(client.post("/detokenize", {"tokens": [10**6]}), 400, "tokens")


def test_more_choices_than_the_queue_holds_is_a_400_not_a_retry(make_client, tiny_loaded):
    engine = Engine(tiny_loaded.model, EngineConfig(max_waiting=2))
    client = make_client(engine=engine)
    reply = client.post("/v1/completions", {"prompt": "hi", "n": 3, "max_tokens": 2})
    assert reply.status == 400 and "Retry-After" not in reply.headers
    assert reply.json()["error"]["param"] == "n"
    assert client.post("/v1/completions", {"prompt": "hi", "n": 2, "max_tokens": 2}).status == 200


# OpenAI's fields about its hosted service, as clients and agent frameworks send them.
HOSTED_FIELDS = {
    "user": "user-1",
    "safety_identifier": "hash-of-user-1",
    "prompt_cache_key": "conversation-7",
    "metadata": {"session": "7", "team": "search"},
    "store": False,
    "service_tier": "auto",
    "modalities": ["text"],
}


def test_hosted_service_fields_are_taken_without_effect(client):
    greedy = {"temperature": 0, "max_tokens": 6}
    plain = chat(client, **greedy).json()["choices"][0]["message"]["content"]
    reply = chat(client, **greedy, **HOSTED_FIELDS)
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"] == plain
    assert chat(client, **greedy, service_tier="default", store=None).status == 200
    completion = {"prompt": "hello", **greedy}
    plain = client.post("/v1/completions", completion).json()["choices"][0]["text"]
    reply = client.post("/v1/completions", {**completion, "user": "user-1"})
    assert reply.status == 200 and reply.json()["choices"][0]["text"] == plain


@pytest.mark.parametrize(
    ("fields", "param", "text"),
    [
        ({"user": 7}, "user", "string"),
        ({"safety_identifier": ["x"]}, "safety_identifier", "string"),
        ({"prompt_cache_key": 1}, "prompt_cache_key", "string"),
        ({"metadata": "tag"}, "metadata", "dictionary"),
        ({"metadata": {"k": 1}}, "metadata.k", "string"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k", "512"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "16"),
        ({"store": "false"}, "store", "boolean"),
        ({"store": True}, "store", "stored chat completions are not offered"),
        ({"service_tier": "priority"}, "service_tier", "one service tier"),
        ({"service_tier": 1}, "service_tier", "string"),
        ({"modalities": ["text", "audio"]}, "modalities", "text only"),
        ({"modalities": ["audio"]}, "modalities", "text only"),
        ({"modalities": "text"}, "modalities", "list"),
        ({"reasoning_effort": "low"}, "reasoning_effort", "does not implement"),
        ({"verbosity": "low"}, "verbosity", "does not implement"),
    ],
)
def test_hosted_service_fields_of_the_wrong_type_or_value_are_400s(client, fields, param, text):
    assert_error(chat(client, **fields), 400, param, text=text)


def test_completions_take_only_the_hosted_fields_openai_gives_them(client):
    reply = client.post("/v1/completions", {"prompt": "hi", "metadata": {"k": "v"}})
    assert_error(reply, 400, "metadata", text="does not implement")
    assert_error(client.post("/v1/completions", {"prompt": "hi", "user": 1}), 400, "user")


@pytest.mark.parametrize("name", ["tiny", "gpt-4o-mini", "org/some-model"])
def test_one_model_is_described_under_any_name(client, name):
    (listed,) = client.get("/v1/models").json()["data"]
    for path in (f"/v1/models/{name}", f"/models/{name}"):
        reply = client.get(path)
        assert reply.status == 200, reply.body
        assert reply.json() == listed
