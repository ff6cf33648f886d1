"""Images through the server and `generate --image` on a tiny random LLaVA: the same red
image in three formats, image tokens in `usage`, image and text requests side by side, and
the command line agreeing with the server."""

from __future__ import annotations

import asyncio
import functools
import io

import httpx
import openai
import pytest

from mlxcel.cli import main
from mlxcel_core.engine import Engine, EngineConfig
from mlxcel_server import ServerSettings, ServerState, ServingModel, create_app
from mlxcel_vision.inputs import MediaPolicy, decode_image
from mlxcel_vision.loading import load_vision_model

from red_images import encode, red_data_url, red_image

QUESTION = "What colour is this?"
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def llava_loaded(tiny_llava):
    return load_vision_model(tiny_llava)


@pytest.fixture
def app(llava_loaded):
    state = ServerState()
    engine = Engine(llava_loaded.model, EngineConfig(context_size=256))
    state.set_ready(ServingModel(llava_loaded, engine, "tiny-llava", 256))
    decoder = functools.partial(decode_image, policy=MediaPolicy())
    yield create_app(state, ServerSettings(n_predict=MAX_TOKENS, image_decoder=decoder))
    state.close(timeout=10)


async def _with_client(app, calls):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        client = openai.AsyncOpenAI(
            api_key="none", base_url="http://app/v1", http_client=http, max_retries=0
        )
        return await asyncio.gather(*(call(client) for call in calls))


def run(app, *calls):
    """Run `calls` (each `async (client) -> result`) together against `app`."""
    return asyncio.run(_with_client(app, calls))


def post_messages(app, body: dict) -> dict:
    """`POST /v1/messages` (Anthropic's API) with `body`; the reply's JSON."""

    async def post():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            return (await http.post("/v1/messages", json=body)).json()

    return asyncio.run(post())


def chat_call(content):
    async def call(client):
        return await client.chat.completions.create(
            model="tiny-llava",
            messages=[{"role": "user", "content": content}],
            temperature=0,
            max_tokens=MAX_TOKENS,
        )

    return call


def with_image(url: str) -> list[dict]:
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]


def image_tokens(loaded) -> int:
    """Placeholder tokens the red image becomes, as the model's own prompter counts them."""
    prompter = loaded.image_prompter
    prompt = prompter.encode(prompter.image_marker, [red_image()])
    return sum(image.num_tokens for image in prompt.images)


def test_png_jpeg_and_webp_give_the_same_tokens_and_greedy_output(app):
    replies = [
        run(app, chat_call(with_image(red_data_url(image_format))))[0]
        for image_format in ("PNG", "JPEG", "WEBP")
    ]

    assert len({reply.usage.prompt_tokens for reply in replies}) == 1
    assert len({reply.choices[0].message.content for reply in replies}) == 1
    assert len({reply.usage.completion_tokens for reply in replies}) == 1


def test_prompt_tokens_exceed_the_text_control_by_the_image_tokens(app, llava_loaded):
    (image_reply,) = run(app, chat_call(with_image(red_data_url("PNG"))))
    (text_reply,) = run(app, chat_call([{"type": "text", "text": QUESTION}]))

    assert image_tokens(llava_loaded) == 16
    assert image_reply.usage.prompt_tokens - text_reply.usage.prompt_tokens == 16


def test_concurrent_image_and_text_requests_equal_their_solo_runs(app):
    image_call = chat_call(with_image(red_data_url("PNG")))
    text_call = chat_call("Name three colours.")
    (solo_image,) = run(app, image_call)
    (solo_text,) = run(app, text_call)

    together = run(app, image_call, text_call, image_call)

    assert [reply.choices[0].message.content for reply in together] == [
        solo_image.choices[0].message.content,
        solo_text.choices[0].message.content,
        solo_image.choices[0].message.content,
    ]


def test_responses_and_messages_images_read_as_chat_images(app, llava_loaded):
    url = red_data_url("PNG")
    (chat,) = run(app, chat_call(with_image(url)))

    async def responses(client):
        return await client.responses.create(
            model="tiny-llava",
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": url},
                        {"type": "input_text", "text": QUESTION},
                    ],
                }
            ],
            temperature=0,
            max_output_tokens=MAX_TOKENS,
        )

    (response,) = run(app, responses)

    source = {"type": "base64", "media_type": "image/png", "data": url.partition(",")[2]}
    message = post_messages(
        app,
        {
            "model": "tiny-llava",
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": source},
                        {"type": "text", "text": QUESTION},
                    ],
                }
            ],
        },
    )

    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert message["content"][0]["text"] == chat.choices[0].message.content
    usage = message["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == chat.usage.prompt_tokens
    # The same image's KV blocks, computed for the earlier requests, are reused.
    assert usage["cache_read_input_tokens"] > image_tokens(llava_loaded)


def test_generate_with_an_image_answers_as_the_server_does(app, tiny_llava, tmp_path):
    (chat,) = run(app, chat_call(with_image(red_data_url("PNG"))))
    image = tmp_path / "red.png"
    image.write_bytes(encode(red_image(), "PNG"))
    out, err = io.StringIO(), io.StringIO()

    code = main(
        [
            "generate", "-m", str(tiny_llava), "-p", QUESTION, "--image", str(image),
            "--temp", "0", "-n", str(MAX_TOKENS), "-c", "256",
        ],
        environ={},
        out=out,
        err=err,
    )  # fmt: skip

    assert code == 0, err.getvalue()
    assert out.getvalue() == chat.choices[0].message.content + "\n"
    assert f"prompt: {chat.usage.prompt_tokens} tokens" in err.getvalue()
