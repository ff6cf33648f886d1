"""`--surgery` and `MLXCEL_SURGERY` through `main(argv)` on the tiny float32 llama: generate,
run, bench and serve apply or refuse the file, and errors are one line with the file's
line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from mlxcel.cli import main

from factories import TinyConfig, write_safetensors_model


def run_cli(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def generate(model: Path, *flags: str, environ: dict[str, str] | None = None) -> str:
    code, out, err = run_cli(
        "generate", "-m", str(model), "-p", "hello", "-no-cnv", "--temp", "0", "-n", "8", *flags,
        environ=environ,
    )  # fmt: skip
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def other_seed(tmp_path_factory) -> Path:
    return write_safetensors_model(tmp_path_factory.mktemp("other") / "seed1", TinyConfig(seed=1))


@pytest.fixture(scope="module")
def replace_all(tmp_path_factory, other_seed) -> Path:
    """Every tensor taken from the other checkpoint: the output must become that model's."""
    path = tmp_path_factory.mktemp("surgery") / "replace.yaml"
    path.write_text(f"edits:\n  - op: replace\n    tensors: '*'\n    from: {other_seed}\n")
    return path


def test_surgery_changes_the_output_to_the_edited_models(
    tiny_safetensors, other_seed, replace_all, capsys
):
    base = generate(tiny_safetensors)
    edited = generate(tiny_safetensors, "--surgery", str(replace_all))
    assert edited != base
    assert edited == generate(other_seed)
    assert f"mlxcel: surgery {replace_all}:2: replace from {other_seed}: 20 tensors" in (
        capsys.readouterr().err
    )


def test_the_environment_mirror_applies_the_file(tiny_safetensors, other_seed, replace_all):
    environ = {"MLXCEL_SURGERY": str(replace_all)}
    assert generate(tiny_safetensors, environ=environ) == generate(other_seed)


def test_run_applies_the_surgery(tiny_safetensors, other_seed, replace_all):
    def answer(model: Path, *flags: str) -> str:
        argv = ("run", str(model), "-p", "hello", "--temp", "0", "-n", "8", *flags)
        code, out, err = run_cli(*argv)
        assert code == 0, err
        return out

    assert answer(tiny_safetensors, "--surgery", str(replace_all)) == answer(other_seed)


def test_bench_applies_the_surgery(tiny_safetensors, replace_all, capsys):
    argv = ("bench", "-m", str(tiny_safetensors), "-p", "8", "-n", "2", "-r", "1")
    code, out, err = run_cli(*argv, "--surgery", str(replace_all))
    assert code == 0, err
    assert "replace from" in capsys.readouterr().err
    assert "mlxcel" in out


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_an_invalid_file_fails_before_loading_with_one_line(tmp_path, tiny_safetensors, command):
    path = tmp_path / "bad.yaml"
    path.write_text("edits:\n  - op: scale\n    tensors: '*'\n    factor: twice\n")
    argv = [command, "-m", str(tiny_safetensors), "--surgery", str(path)]
    code, _, err = run_cli(*argv, *(["-p", "hi"] if command == "generate" else []))
    assert code == 1
    assert err == f"mlxcel: error: {path}:4: expected a number, got 'twice'\n"


def test_a_pattern_matching_nothing_fails_the_load(tmp_path, tiny_safetensors):
    path = tmp_path / "nothing.yaml"
    path.write_text("edits:\n  - op: scale\n    tensors: model.layers.*.mlp.gate\n    factor: 2\n")
    code, _, err = run_cli(
        "generate", "-m", str(tiny_safetensors), "-p", "hi", "--surgery", str(path)
    )
    assert code == 1
    assert err.endswith(f"{path}:3: pattern 'model.layers.*.mlp.gate' matches no tensor\n")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("flags", "environ"), [(["--surgery", ""], {}), ([], {"MLXCEL_SURGERY": " "})]
)
def test_an_empty_surgery_path_is_a_usage_error(tiny_safetensors, flags, environ):
    argv = ["generate", "-m", str(tiny_safetensors), "-p", "hi", *flags]
    code, out, err = run_cli(*argv, environ=environ)
    assert (code, out) == (2, "")
    assert err == "mlxcel: error: --surgery/MLXCEL_SURGERY: the path of the surgery file is empty\n"
