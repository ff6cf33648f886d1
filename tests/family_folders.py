"""Tiny random-weight folders of mlx-lm families for the command tests, written from
tests/models' family configurations (`family_configs.write_family_model`), and copies
of them with their config.json edited."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent / "models"))

from family_configs import write_family_model

__all__ = ["edited_copy", "write_family_model"]


def edited_copy(folder: Path, target: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of model `folder` at `target` whose config.json `edit` changed in place."""
    shutil.copytree(folder, target)
    config = json.loads((target / "config.json").read_text())
    edit(config)
    (target / "config.json").write_text(json.dumps(config))
    return target
