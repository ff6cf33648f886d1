"""llama-server flags pasted into mlxcel's commands: `-t` and `-v` act, the flags without a
meaning on MLX are accepted with one line each saying why, and any other is refused."""

from __future__ import annotations

import io
import logging

import pytest

from mlxcel.cli import main
from mlxcel.common import llama_server_flags
from mlxcel.common.llama_server_flags import IGNORED_FLAGS

from family_folders import write_family_model


def run_cli(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


PASTED = ("-ngl", "99", "-fa", "on", "--jinja", "-tb", "2", "-cb", "--mlock", "--no-mmap",
          "--no-warmup")  # fmt: skip


def test_a_pasted_llama_server_command_line_runs_and_says_what_it_ignores(tiny_gguf):
    argv = ("generate", "-m", str(tiny_gguf), "-p", "hi", "-n", "2", "--temp", "0")
    code, out, err = run_cli(*argv, *PASTED)
    assert code == 0
    ignored = [line for line in err.splitlines() if " ignored: " in line]
    assert len(ignored) == len(IGNORED_FLAGS)
    assert "mlxcel: -ngl/--gpu-layers/--n-gpu-layers ignored: MLX runs every layer" in err
    assert "mlxcel: -fa/--flash-attn ignored: mlxcel chooses its attention kernels" in err
    # The same reply as without them.
    assert out == run_cli(*argv)[1]


def test_ignored_flags_given_through_the_environment_are_reported_too(tiny_gguf):
    argv = ("generate", "-m", str(tiny_gguf), "-p", "hi", "-n", "1")
    code, _, err = run_cli(*argv, environ={"LLAMA_ARG_N_GPU_LAYERS": "all"})
    assert code == 0 and "-ngl/--gpu-layers/--n-gpu-layers ignored" in err
    code, _, err = run_cli(*argv, environ={"LLAMA_ARG_CONT_BATCHING": "0"})
    assert code == 0 and "ignored" not in err


def test_flash_attention_takes_an_optional_value(tiny_gguf):
    argv = ("generate", "-m", str(tiny_gguf), "-n", "1")
    # Old llama.cpp's bare switch, then a flag after it; and the value joined with "=".
    assert run_cli(*argv, "-fa", "-p", "hi")[0] == 0
    assert run_cli(*argv, "--flash-attn=auto", "-p", "hi")[0] == 0
    code, _, err = run_cli(*argv, "-p", "hi", "-fa", "maybe")
    assert code == 2
    assert err == "mlxcel: error: -fa/--flash-attn: expected one of on, off, auto, got 'maybe'\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("-t", "0"), "-t/--threads must be -1 (the default) or >= 1, got 0"),
        (("-tb", "-4"), "-tb/--threads-batch must be -1 (the default) or >= 1, got -4"),
        (
            ("-ngl", "many"),
            "-ngl/--n-gpu-layers: expected a number of layers, 'auto' or 'all', got 'many'",
        ),
        (("--threads", "x"), "--threads: expected an integer, got 'x'"),
    ],
)
def test_values_llama_server_would_refuse_are_refused(tiny_gguf, flags, message):
    code, _, err = run_cli("generate", "-m", str(tiny_gguf), "-p", "hi", *flags)
    assert code == 2 and err == f"mlxcel: error: {message}\n"


def test_threads_set_the_blas_thread_count(tiny_gguf, monkeypatch):
    counts = []
    monkeypatch.setattr(
        llama_server_flags, "limit_own_blas_threads", lambda n: counts.append(n) or True
    )
    monkeypatch.setattr(llama_server_flags, "machine_cores", lambda: 8)
    assert run_cli("generate", "-m", str(tiny_gguf), "-p", "hi", "-n", "1", "-t", "3")[0] == 0
    assert run_cli("generate", "-m", str(tiny_gguf), "-p", "hi", "-n", "1")[0] == 0
    assert counts == [3]
    monkeypatch.setattr(llama_server_flags, "limit_own_blas_threads", lambda n: False)
    _, _, err = run_cli("generate", "-m", str(tiny_gguf), "-p", "hi", "-n", "1", "-t", "2")
    assert "mlxcel: -t/--threads ignored: this process's BLAS is not OpenBLAS" in err


def test_threads_above_the_cores_run_one_per_core(tiny_gguf, monkeypatch):
    counts = []
    monkeypatch.setattr(
        llama_server_flags, "limit_own_blas_threads", lambda n: counts.append(n) or True
    )
    monkeypatch.setattr(llama_server_flags, "machine_cores", lambda: 2)
    code, _, err = run_cli("generate", "-m", str(tiny_gguf), "-p", "hi", "-n", "1", "-t", "8")
    assert code == 0 and counts == [2]
    assert "mlxcel: -t/--threads 8 is above this machine's 2 cores; OpenBLAS runs 2 threads" in err


def test_verbose_logs_mlxcels_own_messages(tmp_path):
    # The engine logs at INFO level that a recurrent model runs without prefix caching.
    mamba = write_family_model(tmp_path / "mamba2", "mamba2")
    argv = ("generate", "-m", str(mamba), "-p", "hi", "-n", "1", "-c", "64")
    code, _, quiet = run_cli(*argv)
    assert code == 0 and "prefix caching is off" not in quiet
    try:
        code, _, err = run_cli(*argv, "-v")
    finally:
        for name in ("mlxcel", "mlxcel_core", "mlxcel_models", "mlxcel_server"):
            logger = logging.getLogger(name)
            logger.handlers.clear()
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
    assert code == 0
    assert "mlxcel: mlxcel_core.engine.parts: prefix caching is off" in err


@pytest.mark.parametrize("command", ["serve", "run", "bench"])
def test_the_other_model_commands_take_them(tiny_gguf, command):
    from mlxcel.cli import make_parser

    args = make_parser(command).parse_args([command, "-ngl", "99", "-fa", "-t", "2", "-v"])
    assert (args.n_gpu_layers, args.flash_attn, args.threads, args.verbose) == (
        "99",
        "on",
        "2",
        True,
    )


def test_a_llama_cpp_flag_mlxcel_lacks_is_still_refused_by_name(tiny_gguf):
    code, _, err = run_cli("generate", "-m", str(tiny_gguf), "-p", "hi", "-sm", "row")
    assert code == 2 and err == "mlxcel: error: unrecognized arguments: -sm\n"
