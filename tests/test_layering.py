"""Each package imports only from the layers below it (DESIGN.md, "Packages and layers")."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}

_MLX = {"mlx", "numpy", "mlxcel_core", "mlxcel_models"}
ALLOWED = {
    "packages/mlxcel-core": {"mlx", "numpy", "mlxcel_core"},
    "packages/mlxcel-models": {
        "mlx", "numpy", "mlx_lm", "tokenizers", "transformers", "jinja2", "safetensors",
        "huggingface_hub", "yaml", "psutil", "gguf",
        "mlxcel_core", "mlxcel_models",
    },
    "packages/mlxcel-vision": _MLX | {"PIL", "transformers", "mlxcel_vision"},
    "packages/mlxcel-audio": _MLX | {
        "soundfile", "av", "soxr", "onnx", "piper", "tokenizers", "mlxcel_audio",
    },
    "packages/mlxcel-distributed": _MLX | {"mlxcel_distributed"},
    "packages/mlxcel-server": {
        "mlx", "numpy", "quart", "pydantic", "werkzeug", "prometheus_client", "llguidance",
        "mlxcel_core", "mlxcel_models", "mlxcel_vision", "mlxcel_audio", "mlxcel_distributed",
        "mlxcel_server",
    },
}  # fmt: skip


def imported_top_level_modules(package: Path) -> dict[str, set[Path]]:
    found: dict[str, set[Path]] = {}
    for source in (package / "src").rglob("*.py"):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(source.relative_to(ROOT))
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_lower_layers(package):
    imports = imported_top_level_modules(ROOT / package)
    forbidden = {
        module: sorted(map(str, files))
        for module, files in imports.items()
        if module not in STDLIB and module not in ALLOWED[package]
    }
    assert not forbidden, f"{package} imports outside its layer: {forbidden}"


def test_every_package_is_covered():
    packages = {str(p.parent.relative_to(ROOT)) for p in ROOT.glob("packages/*/pyproject.toml")}
    assert packages == set(ALLOWED)


def test_only_the_app_imports_the_server():
    for package in ALLOWED:
        if package != "packages/mlxcel-server":
            assert "mlxcel_server" not in imported_top_level_modules(ROOT / package)


def test_the_check_sees_real_imports():
    core = imported_top_level_modules(ROOT / "packages/mlxcel-core")
    models = imported_top_level_modules(ROOT / "packages/mlxcel-models")
    assert "mlx" in core
    assert {"mlxcel_core", "mlx_lm", "tokenizers"} <= set(models)
