"""A real `mlxcel serve` process on a free loopback port, shared by the live-server tests.

All traffic goes to 127.0.0.1 and every wait is bounded. The server's stderr goes to a file
(a pipe nobody drains would block a chatty server), so a test can show it when it fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai

STARTUP_SECONDS = 120.0
STOP_SECONDS = 30.0
STDERR_TAIL_CHARS = 6000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """`python -m mlxcel serve --port PORT *flags`, healthy once constructed.

    `LLAMA_*` and `MLXCEL_*` variables of the test's environment are not passed on, so only
    `flags` configure the server.

    Args:
        flags: more `mlxcel serve` flags (`-m`, `-c`, `-np`, ...).
        startup_seconds: how long to wait for `GET /health` to answer 200.
        audio: serve the default speech models too; without it the server runs with
            `--no-audio`, so a text test neither loads nor lists them.

    Raises:
        AssertionError: the process exited while starting (its stderr is the message).
        TimeoutError: it was not healthy in time (it is stopped first).
    """

    def __init__(
        self, *flags: str, startup_seconds: float = STARTUP_SECONDS, audio: bool = False
    ) -> None:
        self.flags = flags if audio else (*flags, "--no-audio")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._stopped_stderr: str | None = None
        with tempfile.NamedTemporaryFile(
            prefix="mlxcel-serve-", suffix=".stderr", delete=False
        ) as log:
            self.stderr_path = Path(log.name)
        with self.stderr_path.open("ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mlxcel", "serve", "--port", str(self.port), *self.flags],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env={
                    name: value
                    for name, value in os.environ.items()
                    if not name.startswith(("LLAMA_", "MLXCEL_"))
                },
            )
        self._wait_until_healthy(startup_seconds)

    def _wait_until_healthy(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.stderr()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the server did not become healthy in {seconds} s:\n{self.stderr()}")

    def client(self, **kwargs) -> openai.OpenAI:
        """An `openai` client of this server that never retries."""
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, **kwargs)

    def stderr(self, tail_chars: int = STDERR_TAIL_CHARS) -> str:
        """The last `tail_chars` characters the server wrote to stderr so far."""
        if self._stopped_stderr is not None:
            return self._stopped_stderr[-tail_chars:]
        text = self.stderr_path.read_text(encoding="utf-8", errors="replace")
        return text[-tail_chars:]

    @contextlib.contextmanager
    def stderr_on_failure(self) -> Iterator[None]:
        """Attach the server's stderr to any exception raised in the block (as a note)."""
        try:
            yield
        except Exception as error:
            flags = " ".join(self.flags)
            error.add_note(f"--- stderr of `mlxcel serve {flags}` ---\n{self.stderr()}")
            raise

    def stop(self) -> int:
        """SIGTERM, wait for the exit (SIGKILL after `STOP_SECONDS`); the exit code.

        The stderr file is removed; `stderr()` still answers from what it held.
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_SECONDS)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=10)
            if self._stopped_stderr is None:
                self._stopped_stderr = self.stderr_path.read_text(
                    encoding="utf-8", errors="replace"
                )
                self.stderr_path.unlink(missing_ok=True)
