"""The server's version, as `/props` and the OpenAPI document report it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

SOURCE_TREE = "(source tree, not installed)"


def server_version() -> str:
    """mlxcel-server's installed version, or `SOURCE_TREE` when it runs from a source tree
    on `PYTHONPATH`, where no package metadata exists."""
    try:
        return version("mlxcel-server")
    except PackageNotFoundError:
        return SOURCE_TREE
