"""What the user types into `mlxcel run`: lines from a terminal (with line editing and a
persistent history) or from a pipe, gathered into entries.

An entry is one line; a line ending in a backslash continues on the next one; a line
starting with three double quotes opens a block that ends on the line ending with them, as
in ollama. Only a one-line entry starting with `/` is a command.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

PROMPT = ">>> "
CONTINUATION_PROMPT = "... "
BLOCK_QUOTES = '"""'
HISTORY_LENGTH = 1000


class LineReader(Protocol):
    """Reads one line of input, without its line break."""

    def read_line(self, prompt: str) -> str:
        """The next line, after showing `prompt` where there is someone to see it.

        Raises:
            EOFError: the input has ended (Ctrl-D in a terminal).
            KeyboardInterrupt: Ctrl-C in a terminal.
        """
        ...


class TerminalReader:
    """Lines typed in a terminal, edited with the standard library's `readline`."""

    def read_line(self, prompt: str) -> str:
        try:
            return input(prompt)
        except EOFError:
            print()  # Ctrl-D leaves the cursor after the prompt; the shell's goes below.
            raise


@dataclass(frozen=True)
class PipedReader:
    """Lines of a non-interactive input; prompts are not shown."""

    stream: TextIO

    def read_line(self, prompt: str) -> str:
        line = self.stream.readline()
        if not line:
            raise EOFError
        return line.removesuffix("\n").removesuffix("\r")


@dataclass(frozen=True)
class Entry:
    """One message or command as typed.

    Attributes:
        text: the text, lines joined with line breaks.
        is_command: a one-line entry starting with `/`.
    """

    text: str
    is_command: bool

    @property
    def command(self) -> str:
        """The command's name with its slash (`/clear`); only for commands."""
        return self.text.split()[0]


def read_entry(reader: LineReader) -> Entry:
    """The next entry from `reader` (see the module's description).

    Input that ends inside a block or after a trailing backslash ends the entry there.

    Raises:
        EOFError: the input ended before the entry began.
        KeyboardInterrupt: Ctrl-C; the entry typed so far is dropped.
    """
    line = reader.read_line(PROMPT)
    if line.startswith(BLOCK_QUOTES):
        return Entry(_read_block(reader, line.removeprefix(BLOCK_QUOTES)), is_command=False)
    if line.endswith("\\"):
        return Entry(_read_continued(reader, line), is_command=False)
    return Entry(line, is_command=line.lstrip().startswith("/"))


def _read_block(reader: LineReader, first: str) -> str:
    lines = []
    line = first
    while not line.endswith(BLOCK_QUOTES):
        lines.append(line)
        try:
            line = reader.read_line(CONTINUATION_PROMPT)
        except EOFError:
            return "\n".join(lines).strip("\n")
    lines.append(line.removesuffix(BLOCK_QUOTES))
    return "\n".join(lines).strip("\n")


def _read_continued(reader: LineReader, first: str) -> str:
    lines = []
    line = first
    while line.endswith("\\"):
        lines.append(line.removesuffix("\\"))
        try:
            line = reader.read_line(CONTINUATION_PROMPT)
        except EOFError:
            return "\n".join(lines)
    lines.append(line)
    return "\n".join(lines)


@contextlib.contextmanager
def terminal_history(path: Path) -> Iterator[None]:
    """Line editing on `input()`, with the history read from `path` and saved back to it.

    The history is a convenience: a file that cannot be read or written leaves the
    session without it instead of stopping it.
    """
    import readline  # Imported only for a terminal: it may write control codes to stdout.

    readline.set_history_length(HISTORY_LENGTH)
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
