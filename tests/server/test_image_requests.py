"""Images in chat requests to a text-only model, through the official `openai` client:
each unusable image is a 400 naming it, a usable one a 400 saying the model reads none,
and text requests are unchanged."""

from __future__ import annotations

import asyncio
import functools

import httpx
import openai
import pytest

from mlxcel_core.engine import Engine
from mlxcel_server import ServerSettings, ServerState, ServingModel, create_app
from mlxcel_vision.inputs import MediaPolicy, decode_image

from red_images import data_url, red_data_url

RED_PNG = red_data_url("PNG")
CORRUPT = "data:image/png;base64,iVBORw0K!!!!"
NOT_AN_IMAGE = data_url(b"plain text, no picture", "image/png")
DEFAULT_POLICY = MediaPolicy()


def image_part(url: str, detail: str | None = None) -> dict:
    image_url = {"url": url} if detail is None else {"url": url, "detail": detail}
    return {"type": "image_url", "image_url": image_url}


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


@pytest.fixture
def make_app(tiny_loaded):
    states = []

    def make(policy: MediaPolicy | None = DEFAULT_POLICY):
        state = ServerState()
        state.set_ready(ServingModel(tiny_loaded, Engine(tiny_loaded.model), "tiny", 256))
        states.append(state)
        decoder = None if policy is None else functools.partial(decode_image, policy=policy)
        return create_app(state, ServerSettings(n_predict=4, image_decoder=decoder))

    yield make
    for state in states:
        state.close(timeout=10)


def call(app, method: str, **fields):
    """`client.<method>(**fields)` through the `openai` client against `app` in-process."""

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            client = openai.AsyncOpenAI(
                api_key="none", base_url="http://app/v1", http_client=http, max_retries=0
            )
            target = client
            for name in method.split("."):
                target = getattr(target, name)
            return await target(**fields)

    return asyncio.run(run())


def chat(app, content, **fields):
    return call(
        app,
        "chat.completions.create",
        model="tiny",
        messages=[{"role": "user", "content": content}],
        temperature=0,
        **fields,
    )


def bad_request(function, *args, **fields) -> dict:
    with pytest.raises(openai.BadRequestError) as caught:
        function(*args, **fields)
    assert caught.value.status_code == 400
    return caught.value.body


@pytest.mark.parametrize("detail", [None, "auto", "low", "high"])
def test_an_image_to_a_text_only_model_is_a_400(make_app, detail):
    body = bad_request(chat, make_app(), [text_part("What colour?"), image_part(RED_PNG, detail)])

    assert body["message"] == "model 'tiny' has no vision support; send text only"
    assert body["param"] == "messages[0].content[1].image_url"
    assert body["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (CORRUPT, "corrupt base64"),
        (NOT_AN_IMAGE, "not an image"),
        ("/etc/hostname", "local paths are not allowed"),
        ("http://127.0.0.1:9/red.png", "fetching http(s) URLs is disabled"),
    ],
)
def test_unusable_images_are_400s_naming_the_image(make_app, url, reason):
    content = [image_part(RED_PNG), text_part("Compare"), image_part(url)]
    body = bad_request(chat, make_app(), content)

    assert body["message"].startswith(f"image 2: {reason}")
    assert body["param"] == "messages[0].content[2].image_url"
    assert body["code"] == "invalid_image"


def test_a_path_outside_the_allowed_directory_is_a_400(make_app, tmp_path):
    app = make_app(MediaPolicy(allowed_local_path=tmp_path))
    body = bad_request(chat, app, [image_part(f"file://{tmp_path}/../secret.png")])
    assert "image 1: the path" in body["message"]
    assert "outside the allowed directory" in body["message"]


def test_an_unknown_detail_is_refused_by_validation(make_app):
    body = bad_request(chat, make_app(), [image_part(RED_PNG, "ultra")])
    assert body["param"] == "messages[0].content[0].image_url.detail"


@pytest.mark.parametrize("role", ["system", "assistant"])
def test_images_only_in_user_messages(make_app, role):
    messages = [
        {"role": role, "content": [image_part(RED_PNG)]},
        {"role": "user", "content": "Hi"},
    ]
    body = bad_request(call, make_app(), "chat.completions.create", model="tiny", messages=messages)
    assert body["message"].endswith(
        f"only user messages may hold image_url parts, not {role} messages"
    )


def test_a_symlink_loop_under_the_allowed_directory_is_a_400(make_app, tmp_path):
    (tmp_path / "a.png").symlink_to(tmp_path / "b.png")
    (tmp_path / "b.png").symlink_to(tmp_path / "a.png")
    app = make_app(MediaPolicy(allowed_local_path=tmp_path))
    body = bad_request(chat, app, [image_part("a.png")])
    assert body["message"] == "image 1: cannot resolve 'a.png': a symlink loop"
    assert body["code"] == "invalid_image"


def test_a_server_without_image_decoding_still_says_the_model_reads_no_images(make_app):
    body = bad_request(chat, make_app(policy=None), [image_part(RED_PNG)])
    assert "has no vision support" in body["message"]


def test_text_parts_alone_still_generate(make_app):
    app = make_app()
    as_parts = chat(app, [text_part("Say"), text_part("hello")], max_tokens=4)
    as_string = chat(app, "Say\nhello", max_tokens=4)

    assert as_parts.choices[0].message.content == as_string.choices[0].message.content
    assert as_parts.usage.prompt_tokens == as_string.usage.prompt_tokens


def responses_input(*content: dict) -> list[dict]:
    return [{"role": "user", "content": list(content)}]


def test_a_responses_input_image_to_a_text_only_model_is_a_400(make_app):
    image = {"type": "input_image", "image_url": RED_PNG, "detail": "low"}
    body = bad_request(
        call,
        make_app(),
        "responses.create",
        model="tiny",
        input=responses_input({"type": "input_text", "text": "Colour?"}, image),
    )
    assert body["message"] == "model 'tiny' has no vision support; send text only"
    assert body["param"] == "input"


def test_an_unusable_responses_input_image_is_a_400_naming_it(make_app):
    body = bad_request(
        call,
        make_app(),
        "responses.create",
        model="tiny",
        input=responses_input({"type": "input_image", "image_url": CORRUPT}),
    )
    assert body["message"].startswith("image 1: corrupt base64")


def test_a_responses_input_image_outside_a_user_message_is_a_400(make_app):
    body = bad_request(
        call,
        make_app(),
        "responses.create",
        model="tiny",
        input=[{"role": "assistant", "content": [{"type": "input_image", "image_url": RED_PNG}]}],
    )
    assert body["message"].endswith(
        "only user messages may hold input_image items, not assistant messages"
    )


def test_apply_template_with_an_image_on_a_text_only_model_is_a_400(make_app):
    async def run():
        transport = httpx.ASGITransport(app=make_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            messages = [{"role": "user", "content": [image_part(RED_PNG), text_part("Hi")]}]
            return await http.post("/apply-template", json={"messages": messages})

    response = asyncio.run(run())
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "model 'tiny' has no vision support; send text only"
    )


def anthropic_post(app, content: list[dict]) -> httpx.Response:
    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            return await http.post(
                "/v1/messages",
                json={
                    "model": "tiny",
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": content}],
                },
            )

    return asyncio.run(run())


def base64_block(data: str, media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def test_anthropic_image_blocks_are_read_like_chat_images(make_app):
    app = make_app()
    red = RED_PNG.partition(",")[2]
    corrupt = anthropic_post(app, [base64_block(red), base64_block("!!!!")])
    no_vision = anthropic_post(app, [{"type": "text", "text": "Colour?"}, base64_block(red)])
    bad_source = anthropic_post(app, [{"type": "image", "source": {"type": "file"}}])

    assert corrupt.status_code == 400
    assert corrupt.json()["type"] == "error"
    assert corrupt.json()["error"]["message"].startswith("image 2: corrupt base64")
    assert no_vision.status_code == 400
    assert "has no vision support" in no_vision.json()["error"]["message"]
    assert bad_source.status_code == 400
    assert "messages[0].content[0].source" in bad_source.json()["error"]["message"]
