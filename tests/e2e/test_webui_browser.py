"""The chat page in a real browser (headless Chromium) against a real `mlxcel serve` on the
default model (SmolLM2): a question answered, a long reply stopped (the slot frees at once),
and the conversation found again after a reload. One server and one browser for the module."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from browser import chromium, require_browser, screenshot_on_failure, wait_for
from live_server import LiveServer

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
COUNTING = "Count from 1 to 10000, separated by commas."
# The closed connection must free the slot at once; a second allows for a decode step on a
# loaded two-core machine.
IDLE_SECONDS = 1.0


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    require_browser()
    server = LiveServer("-a", "smollm2", "-c", "2048", "--slots")
    yield server
    assert server.stop() == 0, server.stderr()


@pytest.fixture(scope="module")
def browser(server):
    with chromium() as driver:
        yield driver


@pytest.fixture
def page(browser, server, request, tmp_path):
    """The page, no conversations, temperature 0."""
    browser.get(server.url + "/")
    browser.execute_script("localStorage.clear(); localStorage.setItem('mlxcel.settings', "
                           "JSON.stringify({temperature: 0}))")  # fmt: skip
    browser.get(server.url + "/")
    wait_for(lambda: browser.find_element("id", "model-name").text == "smollm2", what="/props")
    yield browser
    screenshot_on_failure(request, browser, tmp_path)


def css(driver, selector: str) -> list:
    return driver.find_elements("css selector", selector)


def slots(server: LiveServer) -> list[dict]:
    return httpx.get(server.url + "/slots", timeout=10).json()


def test_the_page_answers_and_keeps_the_conversation(page, server):
    box = page.find_element("id", "input")
    box.send_keys(QUESTION + "\n")
    send = page.find_element("id", "send")
    wait_for(lambda: not send.is_displayed(), what="the reply to start")
    wait_for(send.is_displayed, seconds=120, what="the reply to finish")
    (reply,) = css(page, ".message.assistant .content")
    assert "Paris" in reply.text
    assert "tokens/s" in css(page, ".message.assistant .stats")[0].text

    page.get(server.url + "/")
    entry = wait_for(lambda: css(page, "#conversations .open"), what="the conversation list")
    assert [e.text for e in entry] == [QUESTION]
    entry[0].click()
    assert [m.text for m in css(page, ".message.user .content")] == [QUESTION]
    assert "Paris" in css(page, ".message.assistant .content")[0].text


def test_stop_ends_the_reply_and_frees_the_slot(page, server):
    page.find_element("id", "input").send_keys(COUNTING + "\n")
    wait_for(
        lambda: len(css(page, ".message.assistant .content")[0].text) > 20,
        seconds=120,
        what="the reply to stream",
    )
    assert any(slot["is_processing"] for slot in slots(server))
    page.find_element("id", "stop").click()
    wait_for(
        lambda: not any(slot["is_processing"] for slot in slots(server)),
        seconds=IDLE_SECONDS,
        what="/slots to show every slot idle",
    )
    wait_for(page.find_element("id", "send").is_displayed, what="the page to be idle")
    assert css(page, ".message.assistant .stats")[0].text == "stopped"
