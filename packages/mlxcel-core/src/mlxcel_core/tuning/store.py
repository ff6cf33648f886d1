"""Tuned values on disk: one JSON file per device and MLX version.

Files live under `${MLXCEL_CACHE_DIR:-~/.cache/mlxcel}/autotune`. A file is named after,
and records, the device and MLX version it was measured with, so another device or MLX
version never reads it: an MLX upgrade or a new GPU starts untuned. Inside, entries are
keyed by tactic and shape bucket. A file with another format version, corrupt JSON or
another scope than its name says is read as empty, and replaced by the next tune.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcel_core.cache_dir import mlxcel_cache_dir

FORMAT_VERSION = 1


def autotune_dir(environ: Mapping[str, str]) -> Path:
    """`${MLXCEL_CACHE_DIR:-~/.cache/mlxcel}/autotune`, the user's home expanded."""
    return mlxcel_cache_dir(environ) / "autotune"


@dataclass(frozen=True)
class TuningScope:
    """What tuned values are valid for: one device and one MLX version.

    Attributes:
        device: the device type with its name and architecture as MLX reports them
            (`"gpu NVIDIA H200 sm_90"`).
        mlx_version: `mx.__version__`.
    """

    device: str
    mlx_version: str

    @classmethod
    def current(cls, device: mx.Device | None = None) -> TuningScope:
        """The scope of `device` (None: the default device) under the running MLX."""
        device = mx.default_device() if device is None else device
        info = mx.device_info(device)
        parts = [
            device.type.name,
            str(info.get("device_name", "")),
            str(info.get("architecture", "")),
        ]
        return cls(" ".join(part for part in parts if part), mx.__version__)

    @property
    def file_name(self) -> str:
        """`<device>__mlx-<version>.json`, lower case, runs of other characters as `-`."""
        device = re.sub(r"[^a-z0-9.]+", "-", self.device.lower()).strip("-")
        return f"{device}__mlx-{self.mlx_version}.json"


@dataclass(frozen=True)
class TunedEntry:
    """One search's result.

    Attributes:
        tactic: the tactic's name (`"prefill_chunk"`).
        bucket: the shape bucket it was measured for (`"model=llama,layers=30,..."`).
        value: the value to use: the winner, or the default when none beat it.
        default: the value used without tuning.
        median_seconds: `value`'s median time per timed call.
        default_median_seconds: the default's median time per timed call.
    """

    tactic: str
    bucket: str
    value: int
    default: int
    median_seconds: float
    default_median_seconds: float


class TuningStore:
    """The tuned values of one scope in `directory`.

    Args:
        directory: the autotune folder (see `autotune_dir`); created on the first write.
        scope: the device and MLX version whose file is read and written.
    """

    def __init__(self, directory: Path, scope: TuningScope) -> None:
        self.directory = directory
        self.scope = scope

    @property
    def path(self) -> Path:
        return self.directory / self.scope.file_name

    def read(self) -> dict[tuple[str, str], TunedEntry]:
        """The stored entries by (tactic, bucket); empty when the file is missing, corrupt,
        of another format version or of another scope. Malformed entries are skipped."""
        document, reason = self._load()
        if reason is not None:
            return {}
        entries = {}
        for fields in document["entries"]:
            entry = _entry_from(fields)
            if entry is not None:
                entries[(entry.tactic, entry.bucket)] = entry
        return entries

    def ignored_reason(self) -> str | None:
        """Why the file, which exists, is read as empty (one line), or None when it is
        missing or current."""
        if not self.path.exists():
            return None
        return self._load()[1]

    def check_writable(self) -> None:
        """Create the folder if needed and write and delete a scratch file in it, so that a
        search learns before its timing that it could not store its result.

        Raises:
            OSError: the folder cannot be created or written.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".tmp-"):
            pass

    def record(self, entry: TunedEntry) -> Path:
        """Add or replace `entry`, keeping the scope's other entries; the file is replaced
        atomically (written beside it, then renamed), so a reader never sees half of it.

        Returns:
            The file written.

        Raises:
            OSError: the folder or file cannot be written.
        """
        entries = self.read()
        entries[(entry.tactic, entry.bucket)] = entry
        document = {
            "format": FORMAT_VERSION,
            "device": self.scope.device,
            "mlx_version": self.scope.mlx_version,
            "entries": [asdict(stored) for stored in entries.values()],
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=self.directory, prefix=".tmp-", suffix=".json", delete=False
        ) as temporary:
            json.dump(document, temporary, indent=1)
        os.replace(temporary.name, self.path)
        return self.path

    def clear(self) -> bool:
        """Delete this scope's file; whether there was one."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True

    def _load(self) -> tuple[Any, str | None]:
        """The file's document, and why it is not current (None when it is)."""
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
        except OSError as error:
            return None, f"cannot be read: {error.strerror or error}"
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None, "is not valid JSON"
        if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
            return document, "is not a tuning file"
        if document.get("format") != FORMAT_VERSION:
            return document, f"has format {document.get('format')!r}, not {FORMAT_VERSION}"
        scope = (document.get("device"), document.get("mlx_version"))
        if scope != (self.scope.device, self.scope.mlx_version):
            return document, f"was tuned for {scope[0]!r}, MLX {scope[1]!r}"
        return document, None


def _entry_from(fields: Any) -> TunedEntry | None:
    try:
        entry = TunedEntry(**fields)
    except TypeError:
        return None
    ints = (entry.value, entry.default)
    if not all(isinstance(value, int) and value >= 1 for value in ints):
        return None
    seconds = (entry.median_seconds, entry.default_median_seconds)
    if not all(isinstance(value, int | float) and value > 0 for value in seconds):
        return None
    if not (isinstance(entry.tactic, str) and isinstance(entry.bucket, str)):
        return None
    return entry
