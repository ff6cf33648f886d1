"""Loading a script of `benchmarks/` as a module, for the tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """Execute `benchmarks/NAME.py` as module `name`, registered in `sys.modules`: its
    dataclasses look their module up by name while it loads, and a script that imports a
    sibling by name (`from kv_quality import ...`) finds the one loaded before it."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
