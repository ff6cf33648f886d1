"""The official `anthropic` client against a real `mlxcel serve` on SmolLM2: create, stream,
count tokens, stop sequences and typed errors."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import anthropic
import pytest
from PIL import Image

from live_server import LiveServer

pytestmark = pytest.mark.slow

MODEL = "smollm2"
KEY = "secret-key"
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
ANSWER = "The capital of France is Paris."


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    # Greedy by default: recent clients no longer take sampling fields as arguments.
    server = LiveServer("-a", MODEL, "-c", "512", "--api-key", KEY, "--temp", "0")
    yield server
    assert server.stop() == 0, server.stderr()


@pytest.fixture
def client(server) -> Iterator[anthropic.Anthropic]:
    with server.stderr_on_failure():
        yield anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def ask(client: anthropic.Anthropic, **fields) -> anthropic.types.Message:
    fields = {"model": MODEL, "max_tokens": 16, "messages": QUESTION, **fields}
    return client.messages.create(**fields)


def test_create_answers_and_counts_the_prompt(client):
    message = ask(client)
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == ANSWER
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    counted = client.messages.count_tokens(model=MODEL, messages=QUESTION)
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens > 0
    assert usage.output_tokens > 0


def test_stream_text_and_final_message(client):
    fields = {"model": MODEL, "max_tokens": 16, "messages": QUESTION}
    # Sampling fields still reach the server in the body.
    sampling = {"temperature": 0.0, "top_k": 1, "top_p": 1.0}
    with client.messages.stream(**fields, extra_body=sampling) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == ANSWER
    assert final.content[0].text == ANSWER and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0


def test_stop_sequences_and_max_tokens(client):
    stopped = ask(client, stop_sequences=["Paris", "France"])
    assert stopped.content[0].text == "The capital of "
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "France"
    cut = ask(client, max_tokens=2)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


def test_errors_are_the_clients_typed_exceptions(client, server):
    png = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(png, format="PNG")
    data = base64.b64encode(png.getvalue()).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    with pytest.raises(anthropic.BadRequestError) as bad:
        ask(client, messages=[{"role": "user", "content": [image]}])
    assert bad.value.status_code == 400
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "has no vision support" in bad.value.message
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve("msgbatch_1")  # no such route
    # A client's fixed model name is served by the one model.
    assert ask(client, model="claude-opus-4-1", max_tokens=2).model == MODEL
    stranger = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        ask(stranger)
