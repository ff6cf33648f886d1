"""Tool results must answer calls: a result with no call before it, one whose id matches no
call, and a call left without its result are 400s on chat completions, the Responses API
(also across `previous_response_id`) and Anthropic's Messages API, in each API's shape."""

import pytest
from replay_engine import ScriptedEngine

from mlxcel_server.errors import ApiError
from mlxcel_server.schemas import ChatMessage
from mlxcel_server.tools.pairing import CHAT_TERMS, check_tool_results

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
USER = {"role": "user", "content": "Weather in Paris?"}
ONE_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def call(call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def calling(*ids: str) -> dict:
    return {"role": "assistant", "tool_calls": [call(i) for i in ids]}


def result(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny"}


def messages(*dicts: dict) -> list[ChatMessage]:
    return [ChatMessage.model_validate(d) for d in dicts]


@pytest.mark.parametrize(
    "conversation",
    [
        [USER],
        [USER, calling("a"), result("a")],
        [USER, calling("a", "b"), result("b"), result("a"), {"role": "user", "content": "ok"}],
        [USER, calling("a"), result("a"), calling("b"), result("b")],
    ],
)
def test_answered_calls_pass(conversation):
    check_tool_results(messages(*conversation), CHAT_TERMS)


@pytest.mark.parametrize(
    ("conversation", "param", "words"),
    [
        ([result("a"), USER], "messages[0]", "follows no tool call"),
        ([{"role": "system", "content": "s"}, result("a"), USER], "messages[1]", "follows no"),
        ([USER, calling("a"), result("b")], "messages[2]", "'b' answers none of the tool call"),
        # A result answers the assistant turn right before it, not an earlier one.
        (
            [USER, calling("a"), result("a"), USER, {"role": "assistant", "content": "x"},
             result("a")],
            "messages[5]",
            "follows no tool call",
        ),
        ([USER, calling("a", "b"), result("a"), USER], "messages[1]", "ids without a tool "
         "message right after them: 'b'"),
        ([USER, calling("a")], "messages[1]", "'a'"),
    ],
)  # fmt: skip
def test_results_without_calls_and_calls_without_results_are_400(conversation, param, words):
    with pytest.raises(ApiError) as caught:
        check_tool_results(messages(*conversation), CHAT_TERMS)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert words in caught.value.message


def assert_openai_400(reply, param: str, words: str) -> None:
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"]


def test_chat_refuses_a_tool_message_first_and_an_unknown_id(client):
    reply = client.post(CHAT, {"messages": [result("call_1"), USER]})
    assert_openai_400(reply, "messages[0]", "tool message with tool_call_id 'call_1'")
    reply = client.post(CHAT, {"messages": [USER, calling("call_1"), result("call_9")]})
    assert_openai_400(reply, "messages[2]", "'call_9' answers none")
    # The same conversation answering its call is served.
    reply = client.post(CHAT, {"messages": [USER, calling("call_1"), result("call_1")],
                               "max_tokens": 1})  # fmt: skip
    assert reply.status == 200


def output(call_id: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": "Sunny"}


def test_responses_refuses_an_output_of_no_call_also_across_previous_response_id(
    make_tool_client,
):
    client, _ = make_tool_client(ONE_CALL)
    reply = client.post(RESPONSES, {"input": [USER, output("call_x")]})
    assert_openai_400(reply, "input", "function_call_output with call_id 'call_x' follows no")
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    first = client.post(RESPONSES, {"input": "Weather?", "tools": [tool]}).json()
    (item,) = first["output"]
    assert item["type"] == "function_call"
    later = {"previous_response_id": first["id"], "tools": [tool], "tool_choice": "none"}
    reply = client.post(RESPONSES, {**later, "input": [output("call_x")]})
    assert_openai_400(reply, "input", "'call_x' answers none of the function_call ids")
    assert repr(item["call_id"]) in reply.json()["error"]["message"]
    # Going on without the result leaves the stored call unanswered.
    reply = client.post(RESPONSES, {**later, "input": "And Tokyo?"})
    assert_openai_400(reply, "input", "function_call ids without a function_call_output")
    assert client.post(RESPONSES, {**later, "input": [output(item["call_id"])]}).status == 200


def assert_anthropic_400(reply, words: str) -> None:
    assert reply.status == 400, reply.body
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert words in body["error"]["message"]


def anthropic(client, *turns: dict):
    return client.post(MESSAGES, {"model": "claude-sonnet-4-5", "max_tokens": 2,
                                  "messages": list(turns)})  # fmt: skip


def test_anthropic_refuses_an_unknown_tool_use_id_and_an_unanswered_tool_use(make_client):
    client = make_client(1024, engine=ScriptedEngine("OK"))
    use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    asked = {"role": "assistant", "content": [use]}
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}
    stray = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}
    assert_anthropic_400(anthropic(client, stray), "tool_result with tool_use_id 'toolu_9'")
    assert_anthropic_400(anthropic(client, USER, asked, stray), "'toolu_9' answers none")
    reply = anthropic(client, USER, asked, {"role": "user", "content": "go on"})
    assert_anthropic_400(reply, "tool_use ids without a tool_result right after them: 'toolu_1'")
    assert anthropic(client, USER, asked, answer).status == 200
