"""Where mlxcel keeps what it writes for later runs: `${MLXCEL_CACHE_DIR:-~/.cache/mlxcel}`.

Standard library only, so that code which runs before MLX is imported may use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

CACHE_DIR_VARIABLE = "MLXCEL_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/mlxcel"


def mlxcel_cache_dir(environ: Mapping[str, str]) -> Path:
    """`${MLXCEL_CACHE_DIR:-~/.cache/mlxcel}`, the user's home expanded."""
    return Path(environ.get(CACHE_DIR_VARIABLE) or DEFAULT_CACHE_DIR).expanduser()
