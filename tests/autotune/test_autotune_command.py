"""`mlxcel tune` end to end on a tiny model, and the tuned prefill chunk taken by the
commands when `-ub` is not given."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from mlxcel.cli import main, make_parser
from mlxcel.common.autotune_settings import apply_autotune, prefill_bucket_for
from mlxcel.common.engine_flags import engine_config_from
from mlxcel.common.flags import BATCH_SIZE_FLAG, resolve_defaults
from mlxcel.generation.generate_command import FLAGS as GENERATE_FLAGS
from mlxcel.models.store_flags import resolve_store_flags
from mlxcel.tuning.bench_command import BENCH_FLAGS
from mlxcel.tuning.tune_searches import search_prefill_chunk
from mlxcel_core.tuning import (
    PREFILL_CHUNK,
    TunedEntry,
    Tunings,
    TuningScope,
    TuningStore,
    install_tunings,
    installed_tunings,
)
from mlxcel_models.loading.loader import load_model


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
    assert err.splitlines() == [
        "mlxcel tune: prefill_chunk: timing chunks 128, 512 on a 200-token prompt",
        "mlxcel tune: prefill_chunk: round 1/2",
        "mlxcel tune: prefill_chunk: round 2/2",
    ]
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


def resolved(command: str, flags, argv: list[str], environ: dict[str, str], err=None, **apply):
    args = make_parser(command).parse_args([command, *argv])
    resolve_defaults(args, flags, environ)
    resolve_store_flags(args, environ)
    apply_autotune(args, environ, err or io.StringIO(), **apply)
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
    err = io.StringIO()
    args = resolved("generate", GENERATE_FLAGS, ["-m", str(tiny_gguf), *argv], environ, err)
    assert engine_config_from(args, max_waiting=1).scheduler.max_prefill_chunk == chunk
    notice = "mlxcel: prefill chunk 256 from the autotune store (MLXCEL_AUTOTUNE)\n"
    assert err.getvalue() == (notice if chunk == 256 else "")
    assert installed_tunings().enabled == (environ.get("MLXCEL_AUTOTUNE") == "1")


def test_bench_takes_the_tuned_chunk_as_its_prefill_step(tiny_gguf, tuned_to_256):
    environ = {**tuned_to_256, "MLXCEL_AUTOTUNE": "1"}
    argv = ["-m", str(tiny_gguf)]
    args = resolved("bench", BENCH_FLAGS, argv, environ, chunk_flag=BATCH_SIZE_FLAG)
    assert args.batch_size == 256
    args = resolved("bench", BENCH_FLAGS, [*argv, "-b", "32"], environ, chunk_flag=BATCH_SIZE_FLAG)
    assert args.batch_size == 32


def test_a_tuned_chunk_is_not_announced_when_none_is_stored_for_the_model(tiny_gguf, tmp_path):
    err = io.StringIO()
    environ = {"MLXCEL_CACHE_DIR": str(tmp_path), "MLXCEL_AUTOTUNE": "1"}
    args = resolved("generate", GENERATE_FLAGS, ["-m", str(tiny_gguf)], environ, err)
    assert args.ubatch_size == 512
    assert err.getvalue() == ""


def test_a_prompt_beyond_the_context_is_refused_before_any_work(tiny_gguf, tmp_path):
    code, out, err = run_cli(
        "tune", "-m", str(tiny_gguf), "--tactic", "prefill_chunk", "--rounds", "2",
        "--tune-prompt-tokens", "256", environ={"MLXCEL_CACHE_DIR": str(tmp_path)},
    )  # fmt: skip
    assert code == 2 and out == ""
    assert err == (
        "mlxcel: error: --tune-prompt-tokens 256 does not fit the model's context of 256 "
        "tokens (at most 255: the prompt and its first token)\n"
    )
    assert not (tmp_path / "autotune").exists()


def test_a_prompt_leaving_only_the_default_neither_searches_nor_stores(tuned_to_256, tiny_gguf):
    store = store_in(Path(tuned_to_256["MLXCEL_CACHE_DIR"]))
    before = store.path.read_bytes()
    code, out, err = run_cli(
        "tune", "-m", str(tiny_gguf), "--tactic", "prefill_chunk", "--rounds", "2",
        "--tune-prompt-tokens", "127", environ=tuned_to_256,
    )  # fmt: skip
    assert code == 0 and out == ""
    assert err == (
        "mlxcel tune: a 127-token prompt leaves only the default chunk 512; nothing searched "
        "or stored (--tune-prompt-tokens 128 or more searches prefill_chunk)\n"
    )
    assert store.path.read_bytes() == before


@pytest.mark.parametrize(
    "action", [("--tactic", "prefill_chunk", "--tune-prompt-tokens", "200"), ("--clear",)]
)
def test_an_unwritable_cache_folder_is_named_before_any_work(tiny_gguf, tmp_path, action):
    cache = tmp_path / "a-file"
    cache.write_text("")
    model = () if action == ("--clear",) else ("-m", str(tiny_gguf))
    code, out, err = run_cli("tune", *model, *action, environ={"MLXCEL_CACHE_DIR": str(cache)})
    assert code == 1 and out == ""
    reason = f"cannot write the autotune folder {cache}/autotune: Not a directory"
    assert err == f"mlxcel: error: {reason}\n"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "is not valid JSON"),
        ('{"format": 99, "entries": []}', "has format 99, not 1"),
        ('{"format": 1, "device": "gpu Other", "mlx_version": "0.1", "entries": []}',
         "was tuned for 'gpu Other', MLX '0.1'"),
    ],
)  # fmt: skip
def test_show_says_why_a_stored_file_is_ignored(tmp_path, content, reason):
    store = store_in(tmp_path)
    store.directory.mkdir()
    store.path.write_text(content)
    code, out, _ = run_cli("tune", "--show", environ={"MLXCEL_CACHE_DIR": str(tmp_path)})
    assert code == 0
    assert out.splitlines()[0] == f"ignored {store.path}: it {reason}"
    assert out.splitlines()[1].startswith("nothing tuned for cpu")


def engine_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "mlxcel-engine"}


def test_ctrl_c_during_the_timing_shuts_every_engine_down(tiny_gguf):
    loaded = load_model(tiny_gguf)
    before = engine_threads()

    def interrupt(done: int) -> None:
        assert len(engine_threads() - before) == 2  # one engine per candidate, running
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        search_prefill_chunk(
            loaded, "bucket", prompt_tokens=130, candidates=(128, 512), default=512,
            rounds=2, on_round=interrupt,
        )  # fmt: skip
    assert engine_threads() == before
