"""Images from the chat page in a real browser (headless Chromium), against the app on a tiny
random LLaVA: the attach button shows for a vision model, images come from the file picker and
from a paste, and go to the model with the message."""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Iterator

import pytest

from mlxcel_core.engine import Engine, EngineConfig
from mlxcel_server import ServerSettings, ServerState, ServingModel, create_app
from mlxcel_vision.inputs import MediaPolicy, decode_image
from mlxcel_vision.loading import load_vision_model

from browser import AppServer, chromium, require_browser, screenshot_on_failure, wait_for
from red_images import encode, red_image

QUESTION = "What colour is this?"

# A paste of an image, as the browser reports one: a File on the event's clipboard data.
PASTE_IMAGE = """
const [base64] = arguments;
const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
const clipboard = new DataTransfer();
clipboard.items.add(new File([bytes], "pasted.png", { type: "image/png" }));
const input = document.querySelector("#input");
input.dispatchEvent(new ClipboardEvent("paste", { clipboardData: clipboard, bubbles: true }));
"""


@pytest.fixture(scope="module")
def server(tiny_llava) -> Iterator[AppServer]:
    require_browser()
    loaded = load_vision_model(tiny_llava)
    state = ServerState()
    engine = Engine(loaded.model, EngineConfig(context_size=512))
    state.set_ready(ServingModel(loaded, engine, "tiny-llava", 512))
    decoder = functools.partial(decode_image, policy=MediaPolicy())
    server = AppServer(create_app(state, ServerSettings(n_predict=4, image_decoder=decoder)))
    yield server
    server.stop()
    state.close(timeout=10)


@pytest.fixture
def page(server, request, tmp_path):
    with chromium() as driver:
        driver.get(server.url + "/")
        wait_for(lambda: driver.find_element("id", "model-name").text == "tiny-llava")
        yield driver
        screenshot_on_failure(request, driver, tmp_path)


def prompt_tokens(driver) -> int:
    def stats():
        if not driver.find_element("id", "send").is_displayed():
            return None
        return driver.find_element("css selector", ".message.assistant .stats").text

    return int(re.search(r"prompt (\d+) tokens", wait_for(stats, what="the reply")).group(1))


def test_images_from_the_picker_and_a_paste_go_with_the_message(page, tmp_path):
    picture = tmp_path / "red.png"
    picture.write_bytes(encode(red_image(), "PNG"))
    assert page.find_element("id", "attach").is_displayed()
    assert not page.find_element("id", "record").is_displayed()
    page.find_element("id", "image-input").send_keys(str(picture))
    page.execute_script(PASTE_IMAGE, base64.b64encode(picture.read_bytes()).decode())
    wait_for(lambda: len(page.find_elements("css selector", "#attachments img")) == 2)
    page.find_element("id", "input").send_keys(QUESTION + "\n")
    with_images = prompt_tokens(page)
    shown = page.find_elements("css selector", ".message.user .images img")
    assert [image.get_attribute("src")[:22] for image in shown] == ["data:image/png;base64,"] * 2
    assert page.find_elements("css selector", ".message.error") == []

    page.find_element("id", "new-chat").click()
    page.find_element("id", "input").send_keys(QUESTION + "\n")
    assert prompt_tokens(page) < with_images
