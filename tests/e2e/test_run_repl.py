"""`mlxcel run` in a pseudo-terminal on the real SmolLM2-135M-Instruct GGUF, as a user types."""

import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

PROMPT = ">>> "
# Generous bounds for a loaded 2-core machine; the test passes as soon as the text arrives.
LOAD_TIMEOUT_SECONDS = 120.0
REPLY_TIMEOUT_SECONDS = 90.0


class Terminal:
    """`mlxcel run` with its stdin and stdout on a pseudo-terminal; stderr to a file."""

    def __init__(self, argv: list[str], environ: dict[str, str], stderr_path) -> None:
        self.master, slave = pty.openpty()
        self.stderr = open(stderr_path, "w")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlxcel", *argv],
            stdin=slave,
            stdout=slave,
            stderr=self.stderr,
            env=environ,
            start_new_session=True,
        )
        os.close(slave)
        self.output = ""

    def read_until(self, text: str, timeout: float) -> str:
        """Everything shown up to and including the next `text`, consumed.

        Raises:
            AssertionError: `text` did not appear within `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while text not in self.output:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {text!r} after {timeout} s; shown: {self.output!r}"
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the process ended and closed the terminal
                    chunk = b""
                assert chunk, f"the terminal closed before {text!r}; shown: {self.output!r}"
                self.output += chunk.decode("utf-8", errors="replace")
        shown, self.output = self.output.split(text, 1)
        return shown + text

    def type_line(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def ask(self, line: str) -> str:
        """The reply to `line`: what is shown between the echoed line and the next prompt."""
        self.type_line(line)
        self.read_until(line, REPLY_TIMEOUT_SECONDS)
        return self.read_until(PROMPT, REPLY_TIMEOUT_SECONDS).removesuffix(PROMPT).strip()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)
        self.stderr.close()


@pytest.fixture
def terminal(tmp_path):
    environ = {**os.environ, "MLXCEL_CACHE_DIR": str(tmp_path), "TERM": "dumb"}
    argv = ["run", "--temp", "0", "-n", "2000"]
    session = Terminal(argv, environ, tmp_path / "stderr.txt")
    yield session
    session.close()


def test_a_conversation_with_an_interrupted_reply(terminal, tmp_path):
    terminal.read_until(PROMPT, LOAD_TIMEOUT_SECONDS)
    first = terminal.ask("Name a fruit.")
    second = terminal.ask("What colour is it?")
    assert "banana" in first.lower()
    assert "banana" in second.lower()  # the second turn sees the first

    terminal.type_line("Write a very long story about a dragon.")
    terminal.read_until("dragon", REPLY_TIMEOUT_SECONDS)
    terminal.read_until(" ", REPLY_TIMEOUT_SECONDS)  # the reply has begun
    terminal.process.send_signal(signal.SIGINT)
    terminal.read_until(PROMPT, REPLY_TIMEOUT_SECONDS)
    assert terminal.process.poll() is None

    assert "Paris" in terminal.ask("What is the capital of France? Answer in one sentence.")
    terminal.type_line("/exit")
    assert terminal.process.wait(timeout=REPLY_TIMEOUT_SECONDS) == 0
    assert "Traceback" not in (tmp_path / "stderr.txt").read_text()
    assert "Name a fruit." in (tmp_path / "run_history").read_text()
