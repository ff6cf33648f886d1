"""Tool calling against a real `mlxcel serve` on SmolLM2 with the official `openai` and
`anthropic` clients and the OpenAI Agents SDK: every tool choice, an agent loop of three turns
through each API, streamed and not, and llama-server's and vLLM's request fields.

SmolLM2's template teaches no tool convention, so these run the generic one: tools in the
system message, replies held by the grammar to a `{"tool_calls": [...]}` object or text.
Decoding is greedy, so a streamed reply must equal the unstreamed one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from live_server import LiveServer

pytestmark = pytest.mark.slow

MODEL = "smollm2"
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": PARAMETERS,
        "strict": True,
    },
}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
RESULT = "Sunny, 21 C."
# Enough for a call of this tool with a short city name; the final answers are cut short.
CALL_TOKENS = 48
ANSWER_TOKENS = 10


@pytest.fixture
def server(smollm2_server) -> LiveServer:
    return smollm2_server


@pytest.fixture
def client(server) -> Iterator[openai.OpenAI]:
    with server.stderr_on_failure():
        yield server.client()


def valid_arguments(arguments: str) -> bool:
    """Whether `arguments` follow PARAMETERS: an object of one string `city`."""
    value = json.loads(arguments)
    return set(value) == {"city"} and isinstance(value["city"], str)


def chat(client: openai.OpenAI, messages, **fields):
    return client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], **fields)


def streamed_chat(client: openai.OpenAI, messages, **fields) -> tuple[str, dict[int, dict], str]:
    """The streamed reply's content, its calls (index -> name, arguments, id, fragments)
    and finish reason."""
    content, calls, finish = "", {}, None
    for chunk in chat(client, messages, stream=True, **fields):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or ():
            call = calls.setdefault(delta.index, {"arguments": "", "fragments": 0})
            if delta.id is not None:
                call.update(id=delta.id, name=delta.function.name)
            call["arguments"] += delta.function.arguments or ""
            call["fragments"] += 1
        finish = choice.finish_reason or finish
    return content, calls, finish


def test_each_tool_choice(client):
    auto = chat(client, QUESTION, tool_choice="auto", max_tokens=16).choices[0]
    if auto.message.tool_calls:
        assert all(valid_arguments(c.function.arguments) for c in auto.message.tool_calls)
    else:
        assert auto.message.content
    # "required" is the first turn of each agent loop below.
    named = {"type": "function", "function": {"name": "get_weather"}}
    forced = chat(client, QUESTION, tool_choice=named, max_tokens=CALL_TOKENS).choices[0]
    assert forced.finish_reason == "tool_calls"
    (call,) = forced.message.tool_calls
    assert call.function.name == "get_weather" and valid_arguments(call.function.arguments)
    plain = chat(client, QUESTION, tool_choice="none", max_tokens=ANSWER_TOKENS).choices[0]
    assert plain.message.tool_calls is None and plain.message.content


def test_chat_agent_loop_streamed_and_not(client):
    first = chat(client, QUESTION, tool_choice="required", max_tokens=CALL_TOKENS).choices[0]
    assert first.finish_reason == "tool_calls"
    (call,) = first.message.tool_calls
    assert call.function.name == "get_weather" and valid_arguments(call.function.arguments)
    content, calls, finish = streamed_chat(
        client, QUESTION, tool_choice="required", max_tokens=CALL_TOKENS
    )
    assert (content, finish) == ("", "tool_calls")
    assert calls[0]["name"] == call.function.name
    # The arguments arrive in pieces that add up to the unstreamed arguments.
    assert calls[0]["arguments"] == call.function.arguments and calls[0]["fragments"] > 1
    history = [
        *QUESTION,
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": RESULT},
    ]
    final = chat(client, history, tool_choice="none", max_tokens=ANSWER_TOKENS).choices[0]
    assert final.message.tool_calls is None and final.message.content
    content, calls, _ = streamed_chat(client, history, tool_choice="none", max_tokens=ANSWER_TOKENS)
    assert content == final.message.content and calls == {}


def test_responses_agent_loop_with_previous_response_id(client):
    fields = {
        "model": MODEL,
        "tools": [
            {"type": "function", "name": "get_weather", "parameters": PARAMETERS, "strict": True}
        ],
        "temperature": 0,
    }
    first = client.responses.create(
        input=QUESTION, tool_choice="required", max_output_tokens=CALL_TOKENS, **fields
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert valid_arguments(call.arguments) and first.status == "completed"
    events = list(
        client.responses.create(
            input=QUESTION,
            tool_choice="required",
            max_output_tokens=CALL_TOKENS,
            stream=True,
            **fields,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == call.arguments
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == call.arguments
    assert kinds[-2:] == ["response.output_item.done", "response.completed"]
    streamed_first = events[-1].response
    answers = []
    for previous, stream in ((first, False), (streamed_first, True)):
        output = {
            "type": "function_call_output",
            "call_id": previous.output[0].call_id,
            "output": RESULT,
        }
        reply = client.responses.create(
            input=[output],
            previous_response_id=previous.id,
            tool_choice="none",
            max_output_tokens=ANSWER_TOKENS,
            stream=stream,
            **fields,
        )
        if stream:
            reply = next(e for e in reply if e.type == "response.incomplete").response
        assert [item.type for item in reply.output] == ["message"]
        answers.append(reply.output_text)
    assert answers[0] and answers[0] == answers[1]


def test_anthropic_agent_loop_streamed_and_not(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    tool = {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "input_schema": PARAMETERS,
    }
    fields = {"model": MODEL, "tools": [tool]}
    first = client.messages.create(
        messages=QUESTION, tool_choice={"type": "any"}, max_tokens=CALL_TOKENS, **fields
    )
    (block,) = first.content
    assert block.type == "tool_use" and first.stop_reason == "tool_use"
    assert valid_arguments(json.dumps(block.input))
    with client.messages.stream(
        messages=QUESTION, tool_choice={"type": "any"}, max_tokens=CALL_TOKENS, **fields
    ) as stream:
        pieces = [e.delta.partial_json for e in stream if e.type == "content_block_delta"]
        streamed = stream.get_final_message()
    assert len(pieces) > 1 and json.loads("".join(pieces)) == block.input
    assert [b.input for b in streamed.content] == [block.input]
    history = [
        *QUESTION,
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": block.id, "content": RESULT}],
        },
    ]
    final = client.messages.create(
        messages=history, tool_choice={"type": "none"}, max_tokens=ANSWER_TOKENS, **fields
    )
    assert [b.type for b in final.content] == ["text"]
    with client.messages.stream(
        messages=history, tool_choice={"type": "none"}, max_tokens=ANSWER_TOKENS, **fields
    ) as stream:
        assert "".join(stream.text_stream) == final.content[0].text


def test_openai_agents_sdk_runs_an_agent_with_a_function_tool(server):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    cities = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return RESULT

    model = agents.OpenAIResponsesModel(
        MODEL, openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    )
    agent = agents.Agent(
        name="weather",
        instructions="Answer briefly.",
        tools=[get_weather],
        model=model,
        model_settings=agents.ModelSettings(
            temperature=0, tool_choice="required", max_tokens=CALL_TOKENS
        ),
        tool_use_behavior="stop_on_first_tool",
    )
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=2)
    assert result.final_output == RESULT and len(cities) == 1 and cities[0]


def test_llama_server_and_vllm_fields(client):
    question = [
        {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
    ]

    def ask(**fields):
        return client.chat.completions.create(
            model=MODEL, messages=question, max_tokens=24, extra_body=fields
        )

    cached = ask()
    cached = ask()
    assert cached.usage.prompt_tokens_details.cached_tokens > 0
    uncached = ask(cache_prompt=False)
    assert uncached.usage.prompt_tokens_details.cached_tokens == 0
    assert uncached.choices[0].message.content == cached.choices[0].message.content
    assert cached.usage.completion_tokens < 20
    assert ask(min_tokens=20).usage.completion_tokens >= 20
    long = client.chat.completions.create(
        model=MODEL, messages=question, max_tokens=32, extra_body={"ignore_eos": True}
    )
    assert long.usage.completion_tokens == 32 and long.choices[0].finish_reason == "length"


def test_replies_cut_at_the_token_limit_finish_with_length(client):
    ask = "Describe Paris as a JSON object with the keys name, country and population."
    json_reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": ask}],
        max_tokens=6,
        response_format={"type": "json_object"},
    )
    assert json_reply.choices[0].finish_reason == "length"
    assert json_reply.choices[0].message.content.startswith('{"name":')
    call = chat(client, QUESTION, tool_choice="required", max_tokens=12).choices[0]
    assert call.finish_reason == "length"


def test_a_fixed_model_name_and_llama_servers_completion_with_a_grammar(server, client):
    """An agent framework's fixed model name is served by the one model; llama-server's
    `/completion` with a GBNF grammar leaves the model the choice among the grammar's
    words, and SmolLM2 picks the right one."""
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=QUESTION, max_tokens=4)
    assert reply.model == MODEL
    body = {
        "prompt": "The capital of France is",
        "n_predict": 8,
        "grammar": 'root ::= " Paris" | " London" | " Berlin" | " Madrid"',
    }
    answer = httpx.post(server.url + "/completion", json=body, timeout=120).json()
    assert answer["content"] == " Paris" and answer["stop_type"] == "eos"
