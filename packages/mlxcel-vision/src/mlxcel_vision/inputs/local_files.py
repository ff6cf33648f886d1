"""Local image files: plain paths and `file://` URLs, confined to the allowed directory."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from mlxcel_vision.inputs.errors import ImageInputError


def local_path(reference: str) -> Path:
    """The path a `file://` URL (percent-decoded) or a plain path names."""
    if reference.lower().startswith("file:"):
        return Path(unquote(urlsplit(reference).path))
    return Path(reference)


def read_allowed_file(path: Path, allowed: Path | None, *, number: int, max_bytes: int) -> bytes:
    """Read `path` if it resolves (symlinks and `..` followed) under `allowed`.

    A relative path is taken relative to `allowed`.

    Raises:
        ImageInputError: local paths are not allowed (`allowed` is None), the path holds a
            NUL character, cannot be resolved (a symlink loop) or lies outside `allowed`, or
            it cannot be read (see `read_file`).
    """
    if allowed is None:
        raise ImageInputError(
            number, "local paths are not allowed (the server sets no --allowed-local-media-path)"
        )
    if "\0" in str(path):
        raise ImageInputError(number, "the path holds a NUL character")
    root = allowed.resolve()
    try:
        resolved = (root / path).resolve()
    except OSError as error:
        raise ImageInputError(number, f"cannot resolve {str(path)!r}: {error.strerror}") from error
    except RuntimeError as error:
        # Python before 3.13 reports a symlink loop as a RuntimeError, later ones as OSError.
        raise ImageInputError(number, f"cannot resolve {str(path)!r}: a symlink loop") from error
    if not resolved.is_relative_to(root):
        raise ImageInputError(number, f"the path {str(path)!r} is outside the allowed directory")
    return read_file(resolved, number=number, max_bytes=max_bytes)


def read_file(path: Path, *, number: int, max_bytes: int) -> bytes:
    """Read a regular file of at most `max_bytes`.

    Raises:
        ImageInputError: no such file, not a regular file, unreadable, or too large.
    """
    if not path.exists():
        raise ImageInputError(number, f"no such file: {path}")
    if not path.is_file():
        raise ImageInputError(number, f"not a regular file: {path}")
    try:
        with path.open("rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as error:
        raise ImageInputError(number, f"cannot read {path}: {error.strerror}") from error
    if len(data) > max_bytes:
        raise ImageInputError(number, f"too large: {path} holds more than {max_bytes} bytes")
    return data
