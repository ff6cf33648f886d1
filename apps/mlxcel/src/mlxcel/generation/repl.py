"""The chat loop of `mlxcel run`: entries in, replies out.

Replies go to `out` and nothing else does, so `mlxcel run < questions.txt > answers.txt`
collects the replies alone; notices (help, a cleared conversation, a full context, the
Ctrl-C hint) go to `err`.
"""

from __future__ import annotations

from typing import TextIO

from mlxcel.common.chat_prompt import check_text
from mlxcel.generation.chat_session import ChatSession, ConversationTooLongError
from mlxcel.generation.reasoning_display import ReplyPrinter, stream_is_terminal
from mlxcel.generation.repl_input import LineReader, read_entry
from mlxcel_core.errors import InputError

HELP = '''\
/clear       forget the conversation (the system prompt stays)
/exit, /bye  leave (Ctrl-D too)
/help        this list
"""          on a line's start opens a multi-line message, at a line's end closes it
\\            at a line's end continues the message on the next line
Ctrl-C       stops the reply; the part already shown stays in the conversation'''
EXIT_COMMANDS = ("/exit", "/bye")
CONTEXT_ADVICE = "/clear to start over, or raise -c/--ctx-size"


def run_repl(
    session: ChatSession,
    reader: LineReader,
    out: TextIO,
    err: TextIO,
    *,
    show_reasoning: bool = False,
) -> int:
    """Answer each message `reader` gives until `/exit`, `/bye` or the end of input; a
    reasoning model's reasoning is hidden, or shown before each answer with
    `show_reasoning` (dimmed when `out` is a terminal).

    Returns:
        The exit code: 0, or 1 when a message could not be sent, so a script piping
        messages in can tell that one of them got no reply.

    A message the chat template cannot render, or one past the context, gets a notice
    and is not sent.

    Raises:
        RunError: generation failed.
    """
    exit_code = 0
    while True:
        try:
            entry = read_entry(reader)
        except EOFError:
            return exit_code
        except KeyboardInterrupt:
            print("\nuse /exit or Ctrl-D to leave", file=err)
            continue
        if not entry.is_command:
            if entry.text.strip():
                printer = ReplyPrinter(out, show=show_reasoning, dim=stream_is_terminal(out))
                if not _answer(session, entry.text, printer, out, err):
                    exit_code = 1
            continue
        command = entry.text.strip()
        if command in EXIT_COMMANDS:
            return exit_code
        if command == "/clear":
            session.clear()
            print("the conversation is cleared", file=err)
        elif command == "/help":
            print(HELP, file=err)
        else:
            print(f"unknown command {command}; /help lists the commands", file=err)


def _answer(
    session: ChatSession, message: str, printer: ReplyPrinter, out: TextIO, err: TextIO
) -> bool:
    """Send `message` and show the reply; False when it could not be sent."""
    try:
        check_text(message, "message")
        result = session.send(message, printer.write_answer, printer.write_reasoning)
    except ConversationTooLongError as error:
        print(f"{error}; {CONTEXT_ADVICE}", file=err)
        return False
    except InputError as error:
        print(f"{error}; it was not sent", file=err)
        return False
    except KeyboardInterrupt:
        # A Ctrl-C while the conversation renders, before the reply streams: nothing sent.
        _end_reply(out)
        return True
    _end_reply(out)
    if result.filled_context:
        print(f"the reply stopped at the end of the context; {CONTEXT_ADVICE}", file=err)
    return True


def _end_reply(out: TextIO) -> None:
    out.write("\n")
    out.flush()
