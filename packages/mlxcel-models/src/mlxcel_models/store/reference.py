"""What a model argument names: a local path, or a Hugging Face id to fetch.

A model argument is a local path (a GGUF file or a model folder), a Hugging Face
`owner/name` id, or a bare `name` under a default organisation; llama-server's
`owner/name:QUANT` picks a repository's GGUF file by its quantization tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

_QUANT_TAG = re.compile(r"[A-Za-z0-9_]+")


@dataclass(frozen=True)
class ModelReference:
    """A model on the Hugging Face Hub.

    Attributes:
        repo_id: `owner/name`.
        quant: the GGUF quantization tag asked for (`Q8_0`), or None.
    """

    repo_id: str
    quant: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.quant is None else f"{self.repo_id}:{self.quant}"


def parse_model_reference(text: str, default_org: str) -> ModelReference | None:
    """The Hub model `text` names, or None when `text` is a local path.

    An existing path is always local; so is text that only a path could be: absolute, or
    starting with `.` or `~`, ending in `.gguf`, or with more than one `/`. The rest must be a
    valid Hugging Face id (`owner/name` or a bare `name`, placed under `default_org`), with
    an optional `:QUANT` tag, or it is taken as a (missing) local path.
    """
    if not text or Path(text).expanduser().exists():
        return None
    return parse_hub_id(text, default_org)


def parse_hub_id(text: str, default_org: str) -> ModelReference | None:
    """`text` read as a Hub id (`owner/name[:QUANT]`, or a bare `name` under
    `default_org`) whatever the disk holds; None when it is not a valid id or only a path
    could be written so."""
    if _looks_like_a_path(text):
        return None
    repo_id, _, quant = text.partition(":")
    if quant and not _QUANT_TAG.fullmatch(quant):
        return None
    if "/" not in repo_id:
        repo_id = f"{default_org}/{repo_id}"
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return None
    return ModelReference(repo_id, quant or None)


def _looks_like_a_path(text: str) -> bool:
    return (
        text.startswith(("/", ".", "~"))
        or "\\" in text
        or text.count("/") > 1
        or text.lower().endswith(".gguf")
    )
