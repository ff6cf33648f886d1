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


# The layers inside mlxcel-core, lowest first: each of its top-level modules imports only
# from its own layer and those below. Tuned values are read by the kernels; the KV caches,
# sampler and generation loop run the kernels; the engine runs them all; the searches of
# `mlxcel tune` drive the engine. Modules not named here sit in the middle layer.
CORE_SOURCE = ROOT / "packages/mlxcel-core/src/mlxcel_core"
CORE_LAYERS = ({"tuning"}, {"kernels"}, None, {"engine"}, {"autotune"})


def imported_modules(source: Path) -> set[str]:
    """The dotted names of the modules `source` imports, absolute imports only."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def imported_top_level_modules(package: Path) -> dict[str, set[Path]]:
    found: dict[str, set[Path]] = {}
    for source in (package / "src").rglob("*.py"):
        for name in imported_modules(source):
            found.setdefault(name.split(".")[0], set()).add(source.relative_to(ROOT))
    return found


def core_layer(module: str) -> int:
    """The index in `CORE_LAYERS` of mlxcel-core's top-level module `module`."""
    named = [index for index, layer in enumerate(CORE_LAYERS) if layer and module in layer]
    return named[0] if named else CORE_LAYERS.index(None)


def core_layer_violations() -> list[str]:
    """`file imports module` for each import of a higher layer inside mlxcel-core."""
    violations = []
    for source in CORE_SOURCE.rglob("*.py"):
        parts = source.relative_to(CORE_SOURCE).with_suffix("").parts
        if parts == ("__init__",):
            continue
        for name in imported_modules(source):
            if name.startswith("mlxcel_core.") and core_layer(name.split(".")[1]) > core_layer(
                parts[0]
            ):
                violations.append(f"{source.relative_to(ROOT)} imports {name}")
    return sorted(violations)


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


def test_layers_inside_core_import_only_downwards():
    assert not core_layer_violations()


def test_the_core_layers_name_real_modules_and_the_kernels_read_tuned_values_from_below():
    modules = {path.stem for path in CORE_SOURCE.iterdir() if path.suffix == ".py" or path.is_dir()}
    assert set().union(*(layer for layer in CORE_LAYERS if layer)) <= modules
    kernel_imports = set().union(
        *(imported_modules(source) for source in (CORE_SOURCE / "kernels").rglob("*.py"))
    )
    assert "mlxcel_core.tuning" in kernel_imports
    assert core_layer("tuning") < core_layer("kernels") < core_layer("cache")
    assert core_layer("cache") < core_layer("engine") < core_layer("autotune")
