"""`mlxcel tune` end to end on a tiny model, and the tuned prefill chunk taken by the
commands when `-ub` is not given."""

from __future__ import annotations

import io

import pytest

from mlxcel.autotune_settings import apply_autotune, prefill_bucket_for
from mlxcel.bench_command import BENCH_FLAGS
from mlxcel.cli import main, make_parser
from mlxcel.engine_flags import engine_config_from
from mlxcel.flags import BATCH_SIZE_FLAG, resolve_defaults
from mlxcel.generate_command import FLAGS as GENERATE_FLAGS
from mlxcel.store_flags import resolve_store_flags
from mlxcel_core.autotune import (
    PREFILL_CHUNK,
    TunedEntry,
    Tunings,
    TuningScope,
    TuningStore,
    install_tunings,
    installed_tunings,
)


@pytest.fixture(autouse=True)
def uninstall_tunings():
    yield
    install_tunings(Tunings(None))


def run_cli(*argv: str, environ: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=environ, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def store_in(cache_dir) -> TuningStore:
    return TuningStore(cache_dir / "autotune", TuningScope.current())


def test_tune_searches_the_prefill_chunk_and_stores_the_verdict(tiny_gguf, tmp_path):
    environ = {"MLXCEL_CACHE_DIR": str(tmp_path)}
    code, out, err = run_cli(
        "tune", "-m", str(tiny_gguf), "--tactic", "prefill_chunk", "--rounds", "2",
        "--tune-prompt-tokens", "200", environ=environ,
    )  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    bucket = prefill_bucket_for(tiny_gguf)
    assert lines[0] == f"prefill_chunk [{bucket}]"
    assert lines[1].split() == ["candidate", "median", "ms", "spread", "ms"]
    assert lines[2].startswith("128 ") and lines[3].startswith("512 (default) ")
    assert lines[4].startswith(("winner 128:", "default kept:"))
    store = store_in(tmp_path)
    assert lines[5] == f"stored in {store.path}"
    stored = store.read()[(PREFILL_CHUNK, bucket)]
    assert stored.default == 512
    assert stored.value == (128 if lines[4].startswith("winner") else 512)

    code, out, _ = run_cli("tune", "--show", environ=environ)
    assert code == 0
    assert f"prefill_chunk  {bucket}  {stored.value}" in out
    code, out, _ = run_cli("tune", "--clear", environ=environ)
    assert code == 0 and out == f"removed {store.path}\n"
    assert not store.path.exists()
    _, out, _ = run_cli("tune", "--show", environ=environ)
    assert out.startswith("nothing tuned for cpu")


def test_the_decode_kernel_tactic_is_skipped_in_one_line_without_cuda(tiny_gguf, tmp_path):
    code, out, err = run_cli(
        "tune", "-m", str(tiny_gguf), "--tactic", "paged_decode_partitions",
        environ={"MLXCEL_CACHE_DIR": str(tmp_path)},
    )  # fmt: skip
    assert code == 0
    assert out == ""
    assert err == "mlxcel tune: paged_decode_partitions needs a CUDA device; skipped\n"
    assert not (tmp_path / "autotune").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--rounds", "1"), "--rounds must be >= 2, got 1"),
        (("--tactic", "tile_size"), "expected one of prefill_chunk, paged_decode_partitions"),
        (("--tune-decode-rows", "1,0"), "--tune-decode-rows: invalid value '1,0'"),
        (("--tune-prompt-tokens", "0"), "--tune-prompt-tokens must be >= 1, got 0"),
        (("--show",), "--show takes no other flags, got --model"),
        (("--show", "--clear"), "--show and --clear: give one"),
        (
            ("--tactic", "prefill_chunk", "--tune-decode-context", "4096"),
            "--tune-decode-context applies to --tactic paged_decode_partitions",
        ),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(tiny_gguf, tmp_path, argv, message):
    code, _, err = run_cli(
        "tune", "-m", str(tiny_gguf), *argv, environ={"MLXCEL_CACHE_DIR": str(tmp_path)}
    )
    assert code == 2
    assert err.startswith("mlxcel: error: ") and err.count("\n") == 1
    assert message in err
    assert not (tmp_path / "autotune").exists()


def resolved(command: str, flags, argv: list[str], environ: dict[str, str], **apply):
    args = make_parser(command).parse_args([command, *argv])
    resolve_defaults(args, flags, environ)
    resolve_store_flags(args, environ)
    apply_autotune(args, environ, **apply)
    return args


@pytest.fixture
def tuned_to_256(tiny_gguf, tmp_path):
    """A cache folder where the tiny model's prefill chunk is tuned to 256."""
    entry = TunedEntry(PREFILL_CHUNK, prefill_bucket_for(tiny_gguf), 256, 512, 1.0, 2.0)
    store_in(tmp_path).record(entry)
    return {"MLXCEL_CACHE_DIR": str(tmp_path)}


@pytest.mark.parametrize(
    ("argv", "environ", "chunk"),
    [
        ([], {"MLXCEL_AUTOTUNE": "1"}, 256),
        ([], {}, 512),
        ([], {"MLXCEL_AUTOTUNE": "0"}, 512),
        (["-ub", "1024"], {"MLXCEL_AUTOTUNE": "1"}, 1024),
        ([], {"MLXCEL_AUTOTUNE": "1", "LLAMA_ARG_UBATCH": "64"}, 64),
    ],
)
def test_the_engine_takes_the_tuned_chunk_unless_ub_is_given(
    tiny_gguf, tuned_to_256, argv, environ, chunk
):
    environ = {**tuned_to_256, **environ}
    args = resolved("generate", GENERATE_FLAGS, ["-m", str(tiny_gguf), *argv], environ)
    assert engine_config_from(args, max_waiting=1).scheduler.max_prefill_chunk == chunk
    assert installed_tunings().enabled == (environ.get("MLXCEL_AUTOTUNE") == "1")


def test_bench_takes_the_tuned_chunk_as_its_prefill_step(tiny_gguf, tuned_to_256):
    environ = {**tuned_to_256, "MLXCEL_AUTOTUNE": "1"}
    argv = ["-m", str(tiny_gguf)]
    args = resolved("bench", BENCH_FLAGS, argv, environ, chunk_flag=BATCH_SIZE_FLAG)
    assert args.batch_size == 256
    args = resolved("bench", BENCH_FLAGS, [*argv, "-b", "32"], environ, chunk_flag=BATCH_SIZE_FLAG)
    assert args.batch_size == 32
