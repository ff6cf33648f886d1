"""The installed entry point, run as a separate process as a user runs it."""

import os
import subprocess
import sys


def run_entry(*argv: str, **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlxcel", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **environment},
        timeout=120,
        check=False,
    )


def test_generate_runs_with_and_without_the_openblas_preload(tiny_gguf):
    argv = ("generate", "-m", str(tiny_gguf), "-p", "hello", "-n", "2", "-no-cnv", "--temp", "0")
    with_preload = run_entry(*argv)
    without = run_entry(*argv, MLXCEL_NO_OPENBLAS="1")
    assert with_preload.returncode == without.returncode == 0, with_preload.stderr
    assert with_preload.stdout == without.stdout
    assert "generated: " in with_preload.stderr


def test_errors_exit_non_zero_without_a_traceback(tmp_path):
    result = run_entry("generate", "-m", str(tmp_path / "missing.gguf"), "-p", "hi")
    assert result.returncode == 1
    assert result.stderr.startswith("mlxcel: error: model not found")
    assert "Traceback" not in result.stderr


def test_mlx_cache_thrashing_check_is_off_unless_the_environment_sets_it(monkeypatch):
    from mlxcel.console import THRASHING_CHECK_VARIABLE, set_process_defaults

    monkeypatch.delenv(THRASHING_CHECK_VARIABLE, raising=False)
    set_process_defaults()
    assert os.environ[THRASHING_CHECK_VARIABLE] == "0"
    monkeypatch.setenv(THRASHING_CHECK_VARIABLE, "1")
    set_process_defaults()
    assert os.environ[THRASHING_CHECK_VARIABLE] == "1"
