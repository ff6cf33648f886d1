"""The operator's media policy: where images may come from and how large they may be."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BYTES = 20 * 2**20
DEFAULT_FETCH_TIMEOUT_SECONDS = 10.0
# 8K (7680 x 4320) fits; a decompression bomb's claimed gigapixels do not.
DEFAULT_MAX_PIXELS = 2**25


@dataclass(frozen=True)
class MediaPolicy:
    """What image references a server or command accepts.

    Attributes:
        allowed_local_path: the directory local paths and `file://` URLs must resolve
            under (symlinks followed); None refuses every local path.
        fetch_enabled: whether `http(s)` URLs are fetched; off by default.
        max_bytes: largest encoded image (bytes) from any source: a data URL's payload, a
            local file or a fetched body.
        fetch_timeout_seconds: time allowed for each network operation of a fetch (the
            connection and every read) and for the whole body, in seconds.
        max_pixels: largest width x height an image may declare; larger ones are refused
            before their pixels are decoded (decompression bombs).

    Raises:
        ValueError: a limit is not positive; the message names the field.
    """

    allowed_local_path: Path | None = None
    fetch_enabled: bool = False
    max_bytes: int = DEFAULT_MAX_BYTES
    fetch_timeout_seconds: float = DEFAULT_FETCH_TIMEOUT_SECONDS
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")
        if not self.fetch_timeout_seconds > 0:
            raise ValueError(f"fetch_timeout_seconds must be > 0, got {self.fetch_timeout_seconds}")
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be >= 1, got {self.max_pixels}")
