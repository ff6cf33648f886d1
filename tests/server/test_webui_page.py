"""The chat page at `/` in a real browser (headless Chromium), against the app served on a
loopback port with an engine that replays set replies: Markdown and code blocks, model text
that looks like HTML, reasoning, statistics, errors, regenerate and edit, conversations, the
API key, and the speech buttons with fake speech models. One server and one browser serve the
whole module."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from audio_fakes import HEARD, FakeSpeechToText, FakeVoice
from replay_engine import ScriptedEngine

from mlxcel_core.engine import EngineConfig, EngineOutput, EngineOverloadedError, OutputSink
from mlxcel_server import ServerSettings, ServerState, ServingModel, create_app
from mlxcel_server.audio_models import ServingAudio
from mlxcel_server.audio_worker import AudioWorker

from browser import AppServer, chromium, require_browser, screenshot_on_failure, wait_for

KEY = "page-test-key"


class PageEngine(ScriptedEngine):
    """Replays `reply` after `</think>`, as the thinking model's template opens its reasoning
    (so a `reply` holding `</think>` starts with reasoning); answers with a full queue while
    `overloaded`, and breaks off before its end while `broken`."""

    config = EngineConfig()
    failure = None

    def __init__(self) -> None:
        super().__init__("")
        self.overloaded = False
        self.broken = False

    def submit(self, requests, sink):
        self.reply = self.reply if "</think>" in self.reply else "</think>" + self.reply
        if self.overloaded:
            raise EngineOverloadedError("the waiting queue is full", retry_after_seconds=3)
        if self.broken:
            return super().submit(requests, BreakingSink(sink))
        return super().submit(requests, sink)


@dataclass(frozen=True)
class BreakingSink:
    """Passes a reply's pieces on, then, in place of its end, something that is not an
    engine output: the server fails mid-reply and the connection drops."""

    sink: OutputSink

    def put(self, output: EngineOutput) -> None:
        self.sink.put(object() if output.finished else output)


@pytest.fixture(scope="module")
def engine() -> PageEngine:
    return PageEngine()


@pytest.fixture(scope="module")
def speech() -> tuple[FakeSpeechToText, FakeVoice]:
    return FakeSpeechToText(), FakeVoice()


@pytest.fixture(scope="module")
def server(thinking_loaded, engine, speech) -> Iterator[AppServer]:
    require_browser()
    state = ServerState()
    state.set_ready(ServingModel(thinking_loaded, engine, "tiny", 1024))
    state.set_audio(ServingAudio(*speech, AudioWorker(max_waiting=4, retry_after_seconds=1)))
    server = AppServer(create_app(state, ServerSettings(api_keys=(KEY,), n_predict=8)))
    yield server
    server.stop()
    state.close(timeout=10)


@pytest.fixture(scope="module")
def browser(server):
    with chromium() as driver:
        yield driver


@pytest.fixture
def page(browser, server, engine, request, tmp_path):
    """The page with the key stored, no conversations, and the engine's default reply."""
    engine.reply, engine.overloaded, engine.broken = "Hello there.", False, False
    browser.get(server.url + "/")
    browser.execute_script(f"localStorage.clear(); localStorage.setItem('mlxcel.apiKey', '{KEY}')")
    browser.get(server.url + "/")
    wait_for(lambda: browser.find_element("id", "model-name").text == "tiny", what="/props")
    yield browser
    screenshot_on_failure(request, browser, tmp_path)


def css(driver, selector: str) -> list:
    return driver.find_elements("css selector", selector)


def send(driver, text: str):
    """Types `text` and Enter; the reply (or error) once the stream has ended."""
    before = len(css(driver, ".message.assistant, .message.error"))
    box = driver.find_element("id", "input")
    box.send_keys(text)
    box.send_keys("\n")
    return finished(driver, before)


def finished(driver, before: int):
    def done():
        # Send shows again only once the reply is drawn for the last time.
        if not driver.find_element("id", "send").is_displayed():
            return None
        replies = css(driver, ".message.assistant, .message.error")
        return replies[-1] if len(replies) > before else None

    return wait_for(done, what="the reply to finish")


def test_the_page_and_its_files_need_no_key_but_the_api_does(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    script = httpx.get(server.url + "/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/nowhere").status_code == 401


def test_the_page_asks_for_the_key_once_and_sends_it(page, server):
    page.execute_script("localStorage.removeItem('mlxcel.apiKey')")
    page.get(server.url + "/")
    dialog = page.find_element("id", "key-dialog")
    wait_for(dialog.is_displayed, what="the key dialog")
    page.find_element("id", "key-input").send_keys("wrong\n")
    wait_for(lambda: "invalid or missing API key" in page.find_element("id", "key-reason").text)
    key = page.find_element("id", "key-input")
    key.clear()
    key.send_keys(KEY + "\n")
    wait_for(lambda: page.find_element("id", "model-name").text == "tiny", what="/props")
    assert not dialog.is_displayed()
    assert page.execute_script("return localStorage.getItem('mlxcel.apiKey')") == KEY
    assert send(page, "Hi").find_element("class name", "content").text == "Hello there."


def test_markdown_renders_code_blocks_lists_and_safe_links(page, engine):
    engine.reply = (
        "Run this:\n\n```python\nprint('<b>hi</b>')\n```\n\n"
        "- **bold** and *soft*\n- `inline`\n\n"
        "[docs](https://example.com/x) and [bad](javascript:alert(1))"
    )
    reply = send(page, "Show me code")
    code = reply.find_element("css selector", "pre > code")
    assert code.text == "print('<b>hi</b>')"
    assert code.get_attribute("class") == "language-python"
    assert [item.text for item in reply.find_elements("css selector", "ul > li")] == [
        "bold and soft",
        "inline",
    ]
    assert reply.find_element("css selector", "li strong").text == "bold"
    (link,) = reply.find_elements("css selector", "a")
    assert link.get_attribute("href") == "https://example.com/x"
    assert "[bad](javascript:alert(1))" in reply.text


MARKDOWN = [
    ("# Title", "<h1>Title</h1>"),
    ("3. three\n4. four", '<ol start="3"><li>three</li><li>four</li></ol>'),
    ("- one\n  more\n- two", "<ul><li>one<br>more</li><li>two</li></ul>"),
    ("> quoted *text*", "<blockquote><p>quoted <em>text</em></p></blockquote>"),
    ("```\nan open fence", "<pre><code>an open fence</code></pre>"),
    ("~~~js\nx = `y`\n~~~", '<pre><code class="language-js">x = `y`</code></pre>'),
    ("snake_case_name and _em_", "<p>snake_case_name and <em>em</em></p>"),
    ("a\nb\n\nc", "<p>a<br>b</p><p>c</p>"),
    ("---", "<hr>"),
    ("**`code` in bold**", "<p><strong><code>code</code> in bold</strong></p>"),
    ("[x](data:text/html,hi) [y](mailto:a@b.c)",
     '<p>[x](data:text/html,hi) <a href="mailto:a@b.c" target="_blank" '
     'rel="noopener noreferrer">y</a></p>'),
    ("<b>&amp;</b> `<i>`", "<p>&lt;b&gt;&amp;amp;&lt;/b&gt; <code>&lt;i&gt;</code></p>"),
]  # fmt: skip


def test_the_markdown_subset_renders_as_expected(page):
    html = page.execute_async_script(
        """
        const [texts, done] = arguments;
        import("./markdown.js").then(({ renderMarkdown }) => done(texts.map((text) => {
          const box = document.createElement("div");
          box.append(renderMarkdown(text));
          return box.innerHTML;
        })));
        """,
        [text for text, _ in MARKDOWN],
    )
    assert html == [expected for _, expected in MARKDOWN]


def test_html_in_a_reply_is_shown_as_text_and_runs_nothing(page, engine):
    markup = "<img src=x onerror=alert(1)>"
    engine.reply = f"Look: {markup} <script>alert(2)</script> `{markup}`"
    page.execute_script("window.alert = () => { document.title = 'alerted'; };")
    reply = send(page, "Say something odd")
    content = reply.find_element("class name", "content")
    assert content.text == f"Look: {markup} <script>alert(2)</script> {markup}"
    assert css(page, "#messages img, #messages script") == []
    assert page.title == "mlxcel"


def test_reasoning_is_shown_collapsed_above_the_answer(page, engine):
    engine.reply = "Plan the answer.</think>The answer."
    reply = send(page, "Think first")
    details = reply.find_element("css selector", "details.reasoning")
    assert details.get_attribute("open") is None
    assert reply.find_element("class name", "content").text == "The answer."
    details.find_element("tag name", "summary").click()
    assert details.find_element("class name", "reasoning-text").text == "Plan the answer."


def test_each_reply_shows_its_token_counts_and_speed(page, engine):
    reply = send(page, "Hi")
    stats = reply.find_element("class name", "stats").text
    # The replayed reply: 10 tokens in 10 ms after the first, the prompt in 10 ms.
    assert re.fullmatch(r"10 tokens, 900\.0 tokens/s · prompt (\d+) tokens, [\d.]+ tokens/s", stats)
    prompt_tokens = int(re.search(r"prompt (\d+)", stats).group(1))
    assert prompt_tokens == len(engine.prompts[-1])


def test_server_errors_show_in_the_conversation_and_retry_works(page, engine):
    page.find_element("id", "open-settings").click()
    top_p = page.find_element("id", "setting-top_p")
    top_p.clear()
    top_p.send_keys("5\t")
    page.find_element("id", "close-settings").click()
    error = send(page, "Hi")
    assert "Error 400" in error.text and "top_p" in error.text
    page.find_element("id", "open-settings").click()
    page.find_element("id", "reset-settings").click()
    page.find_element("id", "close-settings").click()

    engine.overloaded = True
    error = send(page, "Again")
    assert "Error 503" in error.text and "retry in 3 s" in error.text

    engine.overloaded, engine.broken = False, True
    error = send(page, "Once more")
    assert "connection to the server was lost" in error.text

    engine.broken = False
    before = len(css(page, ".message.assistant, .message.error"))
    error.find_element("class name", "regenerate").click()
    # Retry replaces the partial reply and its error with a new reply.
    reply = finished(page, before - 2)
    assert reply.get_attribute("class") == "message assistant"
    assert reply.find_element("class name", "content").text == "Hello there."
    assert len(css(page, ".message.error")) == 2


def test_regenerate_replaces_the_reply_and_edit_resends_the_question(page, engine):
    send(page, "First question")
    engine.reply = "Second try."
    count = len(css(page, ".message.assistant"))
    page.find_element("css selector", ".message.assistant .regenerate").click()
    reply = finished(page, count - 1)
    assert len(css(page, ".message.assistant")) == count
    assert reply.find_element("class name", "content").text == "Second try."

    engine.reply = "Edited answer."
    page.find_element("css selector", ".message.user .edit").click()
    editor = page.find_element("css selector", ".message.user .editor")
    editor.clear()
    editor.send_keys("Changed question")
    page.find_element("css selector", ".message.user .save").click()
    reply = finished(page, count - 1)
    assert [m.text for m in css(page, ".message.user .content")] == ["Changed question"]
    assert reply.find_element("class name", "content").text == "Edited answer."


def test_conversations_are_kept_and_can_be_switched_and_deleted(page, server):
    send(page, "About cats")
    page.find_element("id", "new-chat").click()
    send(page, "About dogs")
    page.get(server.url + "/")
    titles = wait_for(lambda: [e.text for e in css(page, "#conversations .open")])
    assert titles == ["About dogs", "About cats"]
    css(page, "#conversations .open")[1].click()
    assert [m.text for m in css(page, ".message.user .content")] == ["About cats"]
    css(page, "#conversations .delete")[1].click()
    assert [e.text for e in css(page, "#conversations .open")] == ["About dogs"]
    assert [m.text for m in css(page, ".message.user .content")] == ["About dogs"]


def test_the_microphone_transcribes_into_the_message_box(page, speech):
    stt, _ = speech
    calls = stt.calls
    record = page.find_element("id", "record")
    assert record.is_displayed() and not page.find_element("id", "attach").is_displayed()
    record.click()
    wait_for(lambda: record.text == "Stop recording", what="the recording to start")
    time.sleep(1)  # a second of the fake microphone's tone
    record.click()
    box = page.find_element("id", "input")
    wait_for(lambda: box.get_attribute("value") == HEARD, what="the transcript")
    assert stt.calls == calls + 1


def test_play_speaks_the_reply(page):
    reply = send(page, "Hi")
    page.execute_script(
        "window.played = [];"
        "HTMLMediaElement.prototype.play = function () {"
        "  window.played.push(this.src); return Promise.resolve(); };"
    )
    reply.find_element("class name", "play").click()
    (source,) = wait_for(lambda: page.execute_script("return window.played"), what="play")
    assert source.startswith("blob:")
    assert css(page, ".message.error") == []
