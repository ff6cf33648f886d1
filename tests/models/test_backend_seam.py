"""The compute-backend seam: one cached backend, through which every command and server
loads its models, handing back the MLX model itself."""

from __future__ import annotations

import ast
from pathlib import Path

import mlx.nn as nn

from mlxcel_models.backend import MlxBackend, select_backend
from mlxcel_models.language_model import MlxLmLanguageModel
from mlxcel_models.surgery import parse_surgery

ROOT = Path(__file__).resolve().parents[2]
# Loading goes through the backend from here on; only mlxcel-models itself reaches the loader.
ABOVE_THE_SEAM = [
    ROOT / "apps",
    *(p for p in (ROOT / "packages").iterdir() if p.name != "mlxcel-models"),
]
LOADER_MODULES = ("mlxcel_models.loading", "mlx_lm.utils")


def loader_imports(source: Path) -> list[str]:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [name for name in names if name.startswith(LOADER_MODULES)]
    return found


def test_the_backend_is_chosen_once_and_is_mlx():
    backend = select_backend()
    assert backend is select_backend()
    assert isinstance(backend, MlxBackend)
    assert backend.name == "mlx"


def test_the_backend_hands_back_the_mlx_model_itself(tiny_safetensors):
    loaded = select_backend().load_model(tiny_safetensors)
    assert type(loaded.model) is MlxLmLanguageModel
    assert isinstance(loaded.model.module, nn.Module)
    assert loaded.source.path == tiny_safetensors


def test_the_backend_applies_surgery(tiny_safetensors, tmp_path):
    plan = parse_surgery("edits:\n  - {op: prune, layers: 0-1}\n", tmp_path / "s.yaml")
    loaded = select_backend().load_model(tiny_safetensors, surgery=plan)
    assert [edit.num_tensors for edit in loaded.surgery] == [4]
    assert not loaded.model.module.model.layers[1].mlp.down_proj.weight.any().item()


def test_no_command_or_server_module_calls_the_loader_directly():
    offenders = {
        str(source.relative_to(ROOT)): imports
        for folder in ABOVE_THE_SEAM
        for source in folder.rglob("src/**/*.py")
        if (imports := loader_imports(source))
    }
    assert not offenders, f"load models through select_backend(): {offenders}"


def test_the_scan_sees_the_backend_in_use():
    loading = ROOT / "apps/mlxcel/src/mlxcel/common/loading.py"
    assert "mlxcel_models.backend" in ast.unparse(ast.parse(loading.read_text(encoding="utf-8")))
    assert loader_imports(ROOT / "packages/mlxcel-models/src/mlxcel_models/backend.py")
