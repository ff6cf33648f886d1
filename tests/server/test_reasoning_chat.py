"""Reasoning through `/v1/chat/completions`: `reasoning_content`, `--reasoning-format`,
`--reasoning-budget`, tool calls and stop strings inside reasoning."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import pytest
from reasoning_clients import ANSWER, ASK, REASONING, joined, scripted_engine, with_tokenizer
from test_chat_tools import WEATHER_TOOL

from mlxcel_core.engine import EngineOutput, EngineRequest, OutputSink, RequestHandle
from mlxcel_core.request import FinishReason, GenerationStats

from reasoning_factories import (
    HARMONY_TEMPLATE,
    HARMONY_TOKENS,
    OPEN_THINKING_TEMPLATE,
    make_tokenizer,
)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def open_thinking_loaded(tiny_gguf, tiny_loaded):
    return with_tokenizer(tiny_gguf, tiny_loaded, OPEN_THINKING_TEMPLATE)


def chat(client, **fields):
    reply = client.post(CHAT, {"messages": ASK, "temperature": 0, "max_tokens": 16, **fields})
    assert reply.status == 200, reply.body
    return reply


def test_reasoning_goes_to_reasoning_content(make_thinking_client):
    body = chat(make_thinking_client()).json()
    (choice,) = body["choices"]
    assert choice["message"]["reasoning_content"] == REASONING
    assert choice["message"]["content"] == ANSWER
    assert choice["finish_reason"] == "stop"
    # P, l, a, n; the marker and the answer are not reasoning.
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}


def test_streamed_reasoning_comes_first_and_matches(make_thinking_client):
    client = make_thinking_client()
    events = chat(client, stream=True, stream_options={"include_usage": True}).events()
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-2]]
    assert joined(deltas, "reasoning_content") == REASONING
    assert joined(deltas, "content") == ANSWER
    kinds = [key for d in deltas for key in ("reasoning_content", "content") if d.get(key)]
    assert kinds == sorted(kinds, key=lambda kind: kind == "content")
    assert not any("think>" in json.dumps(d) for d in deltas)
    assert events[-2]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 4


@pytest.mark.parametrize("budget", [1, 2])
def test_a_budget_ends_the_reasoning_and_the_answer_follows(make_thinking_client, budget):
    body = chat(make_thinking_client(reasoning_budget=budget)).json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == REASONING[:budget]
    assert message["content"] == ANSWER
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == budget


def test_budget_zero_forces_the_span_shut_when_the_template_has_no_switch(
    make_client, open_thinking_loaded
):
    engine = scripted_engine(open_thinking_loaded.tokenizer, opens_itself=True)
    client = make_client(loaded=open_thinking_loaded, engine=engine, reasoning_budget=0)
    message = chat(client).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": ANSWER, "tool_calls": None}


def test_a_model_that_opens_its_own_span(make_client, open_thinking_loaded):
    engine = scripted_engine(open_thinking_loaded.tokenizer, opens_itself=True)
    client = make_client(loaded=open_thinking_loaded, engine=engine)
    message = chat(client).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (REASONING, ANSWER)


def test_budget_zero_uses_the_templates_switch(make_replay_client):
    client, engine = make_replay_client("Straight answer.", reasoning_budget=0)
    message = chat(client).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Straight answer.", "tool_calls": None}
    prompt = client.post("/detokenize", {"tokens": list(engine.prompts[-1])}).json()["content"]
    assert prompt.endswith("<think>\n\n</think>\n\n")


def test_chat_template_kwargs_reach_the_template(make_replay_client):
    client, engine = make_replay_client("Straight answer.")
    fields = {"chat_template_kwargs": {"enable_thinking": False}}
    message = chat(client, **fields).json()["choices"][0]["message"]
    assert message["content"] == "Straight answer." and "reasoning_content" not in message
    prompt = client.post("/detokenize", {"tokens": list(engine.prompts[-1])}).json()["content"]
    assert prompt.endswith("</think>\n\n")


@pytest.mark.parametrize("where", ["server", "request"])
def test_format_none_leaves_the_text_untouched(make_thinking_client, where):
    if where == "server":
        client, fields = make_thinking_client(reasoning_format="none"), {}
    else:
        client, fields = make_thinking_client(), {"reasoning_format": "none"}
    message = chat(client, **fields).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Plan</think>OK", "tool_calls": None}
    events = chat(client, stream=True, **fields).events()[:-1]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert joined(deltas, "content") == "Plan</think>OK"
    assert not joined(deltas, "reasoning_content")


def test_a_budget_holds_under_format_none(make_thinking_client):
    client = make_thinking_client(reasoning_format="none", reasoning_budget=2)
    body = chat(client).json()
    assert body["choices"][0]["message"]["content"] == "Pl</think>OK"
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2


def test_format_deepseek_legacy_fills_both(make_thinking_client):
    message = chat(make_thinking_client(), reasoning_format="deepseek-legacy").json()
    message = message["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (REASONING, "Plan</think>OK")


def test_an_unknown_format_is_a_400(make_thinking_client):
    reply = make_thinking_client().post(CHAT, {"messages": ASK, "reasoning_format": "x"})
    assert reply.status == 400
    assert "reasoning_format" in reply.json()["error"]["message"]


def test_a_stop_string_inside_the_reasoning_stops_as_in_llama_server(make_thinking_client):
    body = chat(make_thinking_client(), stop=["la"]).json()
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["reasoning_content"] == "P"
    assert choice["message"]["content"] == ""


def test_structured_output_applies_after_the_reasoning(make_thinking_client):
    fields = {"response_format": {"type": "json_object"}, "max_tokens": 8}
    message = chat(make_thinking_client(), **fields).json()["choices"][0]["message"]
    # `P` is no JSON: the grammar would have refused it had it applied inside the span.
    assert message["reasoning_content"] == REASONING
    assert message["content"] != ANSWER


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_inside_the_reasoning_is_not_a_call(make_replay_client, stream):
    reply = f"I could call {CALL} but I know it.\n</think>\n\nIt is sunny."
    client, _ = make_replay_client(reply)
    reply = chat(client, tools=[WEATHER_TOOL], stream=stream)
    if stream:
        events = reply.events()[:-1]
        deltas = [e["choices"][0]["delta"] for e in events]
        assert not any(d["tool_calls"] for d in deltas)
        message = {k: joined(deltas, k) for k in ("reasoning_content", "content")}
        finish = events[-1]["choices"][0]["finish_reason"]
    else:
        choice = reply.json()["choices"][0]
        message, finish = choice["message"], choice["finish_reason"]
        assert message["tool_calls"] is None
    assert finish == "stop"
    assert message["reasoning_content"] == f"I could call {CALL} but I know it."
    assert message["content"] == "It is sunny."


def test_a_tool_call_in_the_answer_is_a_call(make_replay_client):
    client, _ = make_replay_client(f"Need the weather.</think>\n{CALL}")
    choice = chat(client, tools=[WEATHER_TOOL]).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "Need the weather."
    (call,) = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_reasoning_sent_back_renders_through_the_template(make_replay_client):
    client, engine = make_replay_client("Fine.</think>Yes.")
    history = [
        *ASK,
        {"role": "assistant", "content": "Hello", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Again?"},
    ]
    chat(client, messages=history)
    prompt = client.post("/detokenize", {"tokens": list(engine.prompts[-1])}).json()["content"]
    assert "<think>\nGreet back.\n</think>Hello" in prompt
    user_reasoning = [{"role": "user", "content": "x", "reasoning_content": "y"}]
    assert client.post(CHAT, {"messages": user_reasoning}).status == 400


class TokenReplayEngine:
    """Replays fixed token ids through each request's own detokenizer, so that how the
    request decodes (special tokens kept or not) shapes the text."""

    def __init__(self, reply_ids: Sequence[int]) -> None:
        self.reply_ids = reply_ids

    def submit(self, requests: Sequence[EngineRequest], sink: OutputSink) -> RequestHandle:
        for request in requests:
            for token in self.reply_ids:
                text = request.detokenizer.add_token(token)
                sink.put(EngineOutput(index=request.index, text=text, token_id=token))
            stats = GenerationStats(len(request.prompt_ids), 0.01, len(self.reply_ids), 0.01, 0)
            rest = request.detokenizer.finalize()
            sink.put(EngineOutput(request.index, rest, None, FinishReason.STOP, stats))
        return RequestHandle(1)

    def shutdown(self, timeout: float | None = None) -> None:
        return None


def test_channel_markers_that_are_special_tokens(make_client, tiny_gguf, tiny_loaded):
    tokenizer = make_tokenizer(
        tiny_gguf, HARMONY_TEMPLATE, user_tokens=(), special_tokens=HARMONY_TOKENS
    )
    reply = (
        "<|channel|>analysis<|message|>Two and two.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Four."
    )
    engine = TokenReplayEngine(tokenizer.encode(reply))
    loaded = dataclasses.replace(tiny_loaded, tokenizer=tokenizer)
    body = chat(make_client(1024, loaded=loaded, engine=engine)).json()
    message = body["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Two and two.", "Four.")
    reasoning_tokens = len(tokenizer.encode("Two and two."))
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == reasoning_tokens
