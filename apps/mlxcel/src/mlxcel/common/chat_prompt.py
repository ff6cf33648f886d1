"""Chat prompts of `generate` and `run`: the template and system-prompt flags, and a
conversation rendered to token ids."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlxcel.common.flags import Flag, UsageError, pick_one
from mlxcel_core.errors import InputError
from mlxcel_models.tokenizer import Tokenizer, resolve_chat_template

TEMPLATE_FLAGS = (
    Flag(("--chat-template",), "chat_template", str, None,
         "a built-in template name or Jinja text (default: the model's own)",
         env="LLAMA_ARG_CHAT_TEMPLATE"),
    Flag(("--chat-template-file",), "chat_template_file", str, None,
         "read the Jinja chat template from a file", env="LLAMA_ARG_CHAT_TEMPLATE_FILE"),
)  # fmt: skip
CHAT_FLAGS = (
    Flag(("-sys", "--system-prompt"), "system_prompt", str, None,
         "system message for the chat template"),
    *TEMPLATE_FLAGS,
)  # fmt: skip


def check_text(text: str, what: str) -> str:
    """`text` itself, once it is known to encode as UTF-8.

    Raises:
        InputError: it holds lone surrogates (undecodable bytes of the command line).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InputError(f"the {what} is not valid UTF-8 text") from error
    return text


def read_text_file(path: str, what: str) -> str:
    """The UTF-8 text of the file at `path`; `what` names it in the error.

    Raises:
        InputError: the file cannot be read or is not UTF-8.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {what} {path}: {error}") from error


def chat_template_from(args: argparse.Namespace) -> str | None:
    """The Jinja text `--chat-template` or `--chat-template-file` gives, or None for the
    model's own.

    Raises:
        UsageError: both are given by the same source, or the name is unknown.
        InputError: the template file cannot be read.
    """
    source = pick_one(
        args, ("chat_template", "chat_template_file"), "--chat-template or --chat-template-file"
    )
    if source == "chat_template_file":
        return read_text_file(args.chat_template_file, "chat template file")
    if source == "chat_template":
        try:
            return resolve_chat_template(args.chat_template)
        except ValueError as error:
            raise UsageError(f"--chat-template: {error}") from error
    return None


def system_messages(args: argparse.Namespace) -> list[dict[str, str]]:
    """The system message `-sys` gives, as a one-message list, or an empty list.

    Raises:
        InputError: the system prompt is not valid UTF-8.
    """
    if args.system_prompt is None:
        return []
    return [{"role": "system", "content": check_text(args.system_prompt, "system prompt")}]


def check_chat_template(tokenizer: Tokenizer, template: str | None) -> None:
    """Raises `UsageError` when neither `template` nor the model gives a chat template."""
    if template is None and tokenizer.chat_template is None:
        raise UsageError(
            "the model has no chat template: pass --chat-template NAME or -no-cnv for raw text"
        )


def encode_conversation(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, str]],
    template: str | None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of `messages` rendered with `template` (None: the model's), ending with
    the header of the assistant's turn; `template_kwargs` are the template's extra
    variables (`enable_thinking`).

    Raises:
        UsageError: there is no chat template.
        InputError: the template cannot render the messages.
    """
    check_chat_template(tokenizer, template)
    try:
        return tokenizer.encode_chat(
            messages, chat_template=template, template_kwargs=template_kwargs
        )
    except ValueError as error:
        raise InputError(str(error)) from error
