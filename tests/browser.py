"""Headless Chromium driven by Selenium, for the chat page's tests, and an app served on a
loopback port from a thread for it to talk to.

Chromium and its driver are Debian's `chromium` and `chromium-driver` packages. CI installs
them and sets `MLXCEL_REQUIRE_BROWSER=1`, so there a missing browser fails the tests; elsewhere
they are skipped with a reason naming the packages (pytest's `-ra` lists it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config

from call_reports import CALL_REPORT
from live_server import free_port

T = TypeVar("T")

WAIT_SECONDS = 30.0
# Chromium on a closed network: no first-run work, no background fetches that would hang.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
    # A fake microphone (a tone) that needs no permission prompt, and sound that plays
    # without a user gesture.
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
)


def require_browser() -> tuple[str, str]:
    """The paths of `chromium` and `chromedriver`.

    Skips the test when either is missing, or fails it where `MLXCEL_REQUIRE_BROWSER` is set.
    """
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        message = (
            "the chat page's browser tests need Chromium and chromedriver "
            "(apt-get install chromium chromium-driver); they were not run"
        )
        if os.environ.get("MLXCEL_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    return chromium, driver


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless Chromium (Selenium `WebDriver`) with a fresh, empty profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = require_browser()
    with tempfile.TemporaryDirectory(prefix="mlxcel-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        # The tests preload OpenBLAS for MLX; Chromium's renderer fails to start with it.
        environment = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        service = Service(driver_path, env=environment)
        driver = webdriver.Chrome(options=options, service=service)
        driver.set_page_load_timeout(WAIT_SECONDS)
        driver.set_script_timeout(WAIT_SECONDS)
        try:
            yield driver
        finally:
            driver.quit()


def wait_for(condition: Callable[[], T], seconds: float = WAIT_SECONDS, what: str = "") -> T:
    """Polls `condition` until it returns something truthy, which it returns.

    Raises:
        TimeoutError: it did not within `seconds`; the message names `what`.
    """
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(StaleElementReferenceException):
            value = condition()
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds} s for {what or condition}")
        time.sleep(0.05)


def screenshot_on_failure(request: pytest.FixtureRequest, driver, folder: Path) -> None:
    """Saves the page as `folder/screenshot.png` when the test's call failed (its report is
    kept on the item by the `pytest_runtest_makereport` hook in conftest.py)."""
    report = request.node.stash.get(CALL_REPORT, None)
    if report is not None and report.failed:
        path = folder / "screenshot.png"
        driver.save_screenshot(str(path))
        print(f"screenshot of the failed page: {path}")


class AppServer:
    """Serves a Quart `app` on 127.0.0.1 from a thread (Hypercorn, as `mlxcel serve` does),
    answering once constructed; `stop` ends it."""

    def __init__(self, app) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._app = app
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self._thread.start()
        self._ready.wait(WAIT_SECONDS)
        wait_for(self._answers, what=f"the app at {self.url}")

    async def _serve(self) -> None:
        config = Config()
        config.bind = [f"127.0.0.1:{self.port}"]
        config.accesslog = None
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._ready.set()
        await serve(self._app, config, shutdown_trigger=self._stopping.wait)

    def _answers(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(WAIT_SECONDS)
