"""Each package and app imports only what its own pyproject.toml declares, mlxcel-core's
layers import downwards, and no module imports itself back through others (DESIGN.md,
"Packages and layers")."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
PROJECTS = sorted(
    str(path.parent.relative_to(ROOT)) for path in ROOT.glob("*/*/pyproject.toml")
)  # fmt: skip

# The layers inside mlxcel-core, lowest first: each of its top-level modules imports only
# from its own layer and those below. Errors, the threads' MLX streams and where mlxcel's
# cache lives are the base;
# tuned values are read by the kernels; the KV caches, sampler and generation loop run the
# kernels; the engine runs them all; the searches of `mlxcel tune` drive the engine.
# Modules not named here sit in the middle layer.
CORE_SOURCE = ROOT / "packages/mlxcel-core/src/mlxcel_core"
CORE_LAYERS = (
    {"errors", "threads", "cache_dir"},
    {"tuning"},
    {"kernels"},
    None,
    {"engine"},
    {"autotune"},
)


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _import_names_of_distributions() -> dict[str, set[str]]:
    """Installed distribution name (normalized) -> the top-level modules it provides."""
    names: dict[str, set[str]] = {}
    for module, distributions in packages_distributions().items():
        for distribution in distributions:
            names.setdefault(_normalized(distribution), set()).add(module)
    return names


DISTRIBUTION_MODULES = _import_names_of_distributions()


def declared_modules(project: str) -> set[str]:
    """The top-level modules `project` may import: its own, and those of the distributions
    its pyproject.toml names as dependencies or optional dependencies."""
    metadata = tomllib.loads((ROOT / project / "pyproject.toml").read_text())["project"]
    requirements = list(metadata.get("dependencies", []))
    for extra in metadata.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    modules = {path.name for path in (ROOT / project / "src").iterdir() if path.is_dir()}
    for requirement in requirements:
        name = _normalized(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
        # Workspace members are installed editable: their module is their name.
        modules |= DISTRIBUTION_MODULES.get(name, {name.replace("-", "_")})
    return modules


def imported_modules(source: Path) -> set[str]:
    """The dotted names of the modules `source` imports, absolute imports only."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def imported_top_level_modules(project: Path) -> dict[str, set[Path]]:
    found: dict[str, set[Path]] = {}
    for source in (project / "src").rglob("*.py"):
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


def module_graph() -> dict[str, set[str]]:
    """Every mlxcel module (dotted name; a package is its `__init__`) -> the mlxcel modules
    it imports, wherever the import is (a function, a `TYPE_CHECKING` block)."""
    sources = {}
    for project in PROJECTS:
        for source in (ROOT / project / "src").rglob("*.py"):
            parts = source.relative_to(ROOT / project / "src").with_suffix("").parts
            sources[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = source
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        targets = set()
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from package import name`: the module `name` when it is one, else the package.
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in sources else node.module)
        graph[module] = {target for target in targets if target in sources} - {module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


@pytest.mark.parametrize("project", PROJECTS)
def test_each_project_imports_only_what_its_pyproject_declares(project):
    imports = imported_top_level_modules(ROOT / project)
    allowed = declared_modules(project)
    undeclared = {
        module: sorted(map(str, files))
        for module, files in imports.items()
        if module not in STDLIB and module not in allowed
    }
    assert not undeclared, (
        f"{project} imports what its pyproject.toml does not declare: {undeclared}"
    )


def test_every_package_and_the_app_are_covered():
    assert {p for p in PROJECTS if p.startswith("packages/")} >= {
        "packages/mlxcel-core", "packages/mlxcel-models", "packages/mlxcel-server",
    }  # fmt: skip
    assert "apps/mlxcel" in PROJECTS


def test_the_packages_depend_one_way():
    """mlxcel-core depends on no other package; only the app imports the server."""
    assert {m for m in declared_modules("packages/mlxcel-core") if m.startswith("mlxcel")} == {
        "mlxcel_core"
    }
    for project in PROJECTS:
        if project not in ("packages/mlxcel-server", "apps/mlxcel"):
            assert "mlxcel_server" not in imported_top_level_modules(ROOT / project), project


def test_the_check_sees_real_imports():
    core = imported_top_level_modules(ROOT / "packages/mlxcel-core")
    models = imported_top_level_modules(ROOT / "packages/mlxcel-models")
    assert "mlx" in core
    assert {"mlxcel_core", "mlx_lm", "tokenizers"} <= set(models)
    assert {"yaml", "mlx_lm", "huggingface_hub"} <= declared_modules("packages/mlxcel-models")
    assert "PIL" in declared_modules("packages/mlxcel-vision")
    assert "mlxcel_server" in declared_modules("apps/mlxcel")


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


def test_no_module_imports_itself_back_through_others():
    assert import_cycles(module_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert "mlxcel_models.lora.adapters" in module_graph()["mlxcel_models.attach_lora"]
