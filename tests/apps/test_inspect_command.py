"""`mlxcel inspect` and the memory check `generate` and `serve` run before loading."""

import io
import json
import re
import socket
import subprocess
import sys

import mlx.core as mx
import pytest

from mlxcel.cli import main, make_parser
from mlxcel.common.flags import RunError, resolve_defaults
from mlxcel.common.loading import compute_options
from mlxcel.common.memory_preflight import check_memory, estimate_for_start
from mlxcel.generation.generate_command import FLAGS as GENERATE_FLAGS
from mlxcel.models.store_flags import resolve_store_flags
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loading.loader import load_model
from mlxcel_models.memory import MemoryBudget

from factories import TinyConfig, write_sliding_window_model
from family_folders import write_family_model
from hf_hub_server import HubServer, folder_files

REFUSAL = "mlxcel: error: the model and one sequence of the context size need "


def run_cli(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_inspect_json_reports_the_tiny_models_shape_weights_and_kv_cache(tiny_gguf):
    code, out, err = run_cli("inspect", "-m", str(tiny_gguf), "-c", "100", "-np", "3", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["format"], report["architecture"]) == ("gguf", "llama")
    assert (report["layers"], report["heads"], report["kv_heads"], report["head_dim"]) == (
        2, 4, 2, 16,
    )  # fmt: skip
    assert (report["context_length"], report["ctx_size"], report["parallel"]) == (256, 100, 3)
    loaded = load_model(tiny_gguf, compute=compute_options(3))  # as inspect -np 3 counts
    assert report["weights"]["resident_bytes"] == loaded.config.weight_bytes
    assert report["parameters"] == loaded.config.num_parameters
    rows = {row["type"]: row for row in report["kv_cache"]}
    assert list(rows) == ["auto", "f32", "f16", "bf16", "q8_0", "q4_0", "turbo2", "turbo3",
                          "turbo4"]  # fmt: skip
    # float32 on the CPU: 2 layers x 2 heads x (16 + 16) features x 4 bytes
    assert rows["auto"]["bytes_per_token"] == 512
    assert rows["auto"]["context_bytes"] == (7 + 1) * 16 * 512
    assert rows["auto"]["parallel_bytes"] == (3 * 7 + 1) * 16 * 512
    assert "multiple of 32" in rows["q8_0"]["error"]
    memory = report["memory"]
    assert memory["kv_cache"] == rows["auto"]["context_bytes"]
    assert memory["total"] == memory["weights"] + memory["kv_cache"] + memory["activations"]
    assert report["fits"] == "all"
    assert report["margin_bytes"] == memory["usable"] - memory["total_parallel"]


def test_inspect_text_names_the_chosen_cache_types_and_a_verdict(tiny_gguf):
    code, out, _ = run_cli("inspect", "-m", str(tiny_gguf), "-ctk", "f16", "-ctv", "turbo4")
    assert code == 0
    assert "2 layers, 4 heads, 2 KV heads, head dim 16" in out
    assert "(-ctk f16, -ctv turbo4, --cache-residual 16)" in out
    assert "  q8_0     n/a: cache type q8_0 needs a head dim" in out
    assert out.splitlines()[-1].startswith("verdict       fits: 4 sequences of 4096 tokens")


def test_inspect_says_when_the_context_does_not_fit_and_still_exits_0(tiny_gguf):
    code, out, _ = run_cli("inspect", "-m", str(tiny_gguf), "-c", "100000000", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["fits"] == "none" and report["margin_bytes"] < 0


def test_inspect_refuses_a_missing_or_corrupt_model_in_one_line(tmp_path, tiny_gguf):
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(tiny_gguf.read_bytes()[:100])
    for path, message in ((tmp_path / "absent.gguf", "model not found"),
                          (corrupt, "corrupt or truncated GGUF header")):  # fmt: skip
        code, out, err = run_cli("inspect", "-m", str(path))
        assert code == 1 and out == ""
        assert err.startswith("mlxcel: error: ") and message in err
        assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["-b", "0"], "-b/--batch-size must be >= 1, got 0"),
        (["-ctk", "q5"], "-ctk/--cache-type-k must be one of auto, f32"),
        (["-ctv", "q5"], "-ctv/--cache-type-v must be one of auto, f32"),
        (["-ctk", "turbo4", "--cache-residual", "-1"], "--cache-residual must be >= 0, got -1"),
        (["--cache-residual", "16"], "--cache-residual keeps exact copies beside a quantized"),
    ],
)
def test_inspect_names_the_flag_at_fault(tiny_gguf, flags, message):
    code, out, err = run_cli("inspect", "-m", str(tiny_gguf), *flags)
    assert (code, out) == (2, "")
    assert err.startswith(f"mlxcel: error: {message}") and err.count("\n") == 1


def test_a_hugging_face_id_is_inspected_and_checked_from_the_store(tmp_path, tiny_safetensors):
    with HubServer() as hub:
        hub.add_repo("test-org/tiny", folder_files(tiny_safetensors))
        environ = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"),
                   "MLXCEL_CACHE_DIR": str(tmp_path / "mlxcel")}  # fmt: skip
        code, out, err = run_cli("inspect", "-m", "test-org/tiny", "--json", environ=environ)
        assert code == 0, err
        report = json.loads(out)
        assert report["model"] == str(tmp_path / "mlxcel" / "models" / "test-org" / "tiny")
        assert report["format"] == "safetensors" and report["layers"] == 2
        hub.requests.clear()
        argv = ["generate", "-m", "test-org/tiny", "-p", "hi", "-c", "100000000"]
        code, _, err = run_cli(*argv, environ=environ)
        assert code == 1 and err.startswith(REFUSAL)
        assert hub.requests == []  # found in the store


def test_generate_refuses_a_context_that_does_not_fit_before_loading(tiny_gguf):
    code, out, err = run_cli("generate", "-m", str(tiny_gguf), "-p", "hi", "-c", "100000000")
    assert code == 1 and out == ""
    assert err.startswith(REFUSAL) and err.count("\n") == 1
    assert "lower -c/--ctx-size" in err and "--no-memory-check" in err
    assert "loading" not in err


def starved(*extra: str) -> list[str]:
    """A run whose budget cannot hold the weights, while the engine, told its number of KV
    blocks, does not plan from memory and starts all the same."""
    return ["generate", "-m", "MODEL", "-p", "hello", "-no-cnv", "--temp", "0", "-n", "3",
            "-c", "64", "--gpu-memory-utilization", "0.000001", "--kv-cache-blocks", "16",
            *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "environ"),
    [(("--no-memory-check",), {}), ((), {"LLAMA_ARG_NO_MEMORY_CHECK": "1"})],
)
def test_no_memory_check_starts_what_the_check_would_refuse(tiny_gguf, extra, environ):
    argv = [str(tiny_gguf) if a == "MODEL" else a for a in starved(*extra)]
    refused = run_cli(*[str(tiny_gguf) if a == "MODEL" else a for a in starved()])
    assert refused[0] == 1 and refused[2].startswith(REFUSAL)
    code, out, err = run_cli(*argv, environ=environ)
    assert code == 0, err
    assert out.strip()


def test_estimate_memory_prints_the_breakdown_and_still_runs(tiny_gguf):
    code, _, err = run_cli(
        "generate", "-m", str(tiny_gguf), "-p", "hi", "-no-cnv", "-n", "2", "--estimate-memory"
    )
    assert code == 0, err
    first = err.splitlines()[0]
    assert first.startswith("mlxcel: memory: needs ") and "weights " in first
    assert "usable (90% of " in first


def test_a_draft_model_adds_its_weights_and_kv_cache(tiny_gguf):
    def estimate_line(*extra: str) -> str:
        args = make_parser("generate").parse_args(
            ["generate", "-m", str(tiny_gguf), "-p", "x", "--estimate-memory", *extra]
        )
        resolve_defaults(args, GENERATE_FLAGS, {})
        resolve_store_flags(args, {})
        err = io.StringIO()
        check_memory(args, err, ComputeOptions.for_device(mx.default_device()), running_sequences=1)
        return err.getvalue()

    alone, with_draft = estimate_line(), estimate_line("-md", str(tiny_gguf))
    weights = re.search(r"weights ([\d.]+) KiB \+ KV ([\d.]+) MiB", alone).groups()
    doubled = re.search(r"weights ([\d.]+) KiB \+ KV ([\d.]+) MiB", with_draft).groups()
    assert [float(x) for x in doubled] == pytest.approx([2 * float(x) for x in weights], rel=0.01)


def estimate_line(*argv: str, budget: MemoryBudget | None = None, running: int = 1) -> str:
    """What `generate --estimate-memory` prints for `argv` with `running` sequences at once,
    checked against `budget`."""
    args = make_parser("generate").parse_args(["generate", *argv, "--estimate-memory"])
    resolve_defaults(args, GENERATE_FLAGS, {})
    resolve_store_flags(args, {})
    err = io.StringIO()
    check_memory(args, err, compute_options(1), running_sequences=running, budget=budget)
    return err.getvalue()


# The tiny model's float16 copies: 2 layers x 2 KV heads x (16 key + 16 value features) x 2
# bytes per position, for one sequence's window of 16 in blocks of 16: the 2 blocks it can
# touch, twice, and the null block.
WINDOW_BYTES = 5 * 16 * 2 * 2 * 32 * 2


def test_the_estimate_counts_the_residual_window_beside_the_kv_cache(tiny_gguf):
    model = ["-m", str(tiny_gguf), "-p", "x", "-ctk", "turbo4", "-ctv", "turbo4"]
    windowed = estimate_line(*model)  # the default window of 16 on this device
    assert f"+ residual window {WINDOW_BYTES / 1024:.1f} KiB + activations " in windowed
    assert re.search(r"\+ KV [\d.]+ [KM]iB \+ residual window", windowed)
    assert "residual window" not in estimate_line(*model, "--cache-residual", "0")
    assert "residual window" not in estimate_line("-m", str(tiny_gguf), "-p", "x")


def test_the_check_refuses_what_fits_only_without_the_residual_window(tiny_gguf):
    model = ["-m", str(tiny_gguf), "-p", "x", "-ctk", "turbo4", "-ctv", "turbo4"]
    args = make_parser("generate").parse_args(["generate", *model, "--cache-residual", "0"])
    resolve_defaults(args, GENERATE_FLAGS, {})
    resolve_store_flags(args, {})
    without = estimate_for_start(args, compute_options(1), running_sequences=1).total
    budget = MemoryBudget(2**40, without + WINDOW_BYTES // 2, 0.9)
    estimate_line(*model, "--cache-residual", "0", budget=budget)
    with pytest.raises(RunError, match=r"\+ residual window 20\.0 KiB \+ activations"):
        estimate_line(*model, budget=budget)


def test_the_check_counts_the_windows_of_every_sequence_decoded_at_once(tiny_gguf):
    model = ["-m", str(tiny_gguf), "-p", "x", "-ctk", "turbo4", "-ctv", "turbo4"]
    # 3 sequences: the 2 blocks each can touch, twice, and the null block.
    three_windows = 13 * 16 * 2 * 2 * 32 * 2
    assert f"+ residual window {three_windows / 1024:.1f} KiB" in estimate_line(*model, running=3)
    args = make_parser("generate").parse_args(["generate", *model, "--cache-residual", "0"])
    resolve_defaults(args, GENERATE_FLAGS, {})
    resolve_store_flags(args, {})
    without = estimate_for_start(args, compute_options(1), running_sequences=3).total
    budget = MemoryBudget(2**40, without + WINDOW_BYTES, 0.9)
    estimate_line(*model, budget=budget)  # one sequence's window fits
    with pytest.raises(RunError) as refusal:
        estimate_line(*model, budget=budget, running=3)
    message = str(refusal.value)
    assert message.startswith(
        "the model and one sequence of the context size, with what 3 sequences at once set "
        "aside, need "
    )
    assert "lower --cache-residual, lower -np/--parallel, or pass --no-memory-check" in message


def test_serve_checks_the_windows_of_its_parallel_sequences(tiny_gguf):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["serve", "-m", str(tiny_gguf), "-ctk", "turbo4", "--cache-residual", "100000"]
    windows = {}
    for parallel in ("1", "4"):
        # A budget nothing fits: serve refuses (exit 1) after printing the estimate.
        code, _, err = run_cli(
            *argv, "-np", parallel, "--port", str(port), "--estimate-memory",
            "--gpu-memory-utilization", "0.000001",
        )  # fmt: skip
        assert code == 1, err
        windows[parallel] = float(re.search(r"residual window ([\d.]+) MiB", err).group(1))
    assert windows["4"] > 3.5 * windows["1"]


def test_inspect_counts_the_residual_windows_of_the_parallel_sequences(tiny_gguf):
    argv = ["inspect", "-m", str(tiny_gguf), "-c", "100", "-np", "3", "-ctk", "turbo4"]
    code, out, err = run_cli(*argv, "--json")
    assert code == 0, err
    windowed = json.loads(out)
    without = json.loads(run_cli(*argv, "--cache-residual", "0", "--json")[1])
    assert (windowed["cache_residual"], without["cache_residual"]) == (16, 0)
    memory, base = windowed["memory"], without["memory"]
    keys_per_position = 2 * 2 * 16 * 2  # -ctv auto: the values are exact already
    # 3 sequences (-np), as the engine sets them aside: 2 blocks each, twice, and the null
    # block; with one sequence's KV blocks or with all of them.
    assert (memory["residual"], base["residual"]) == (13 * 16 * keys_per_position, 0)
    assert memory["total"] == (
        memory["weights"] + memory["kv_cache"] + memory["residual"] + memory["activations"]
    )
    assert memory["total"] - base["total"] == memory["residual"]
    assert memory["total_parallel"] - base["total_parallel"] == memory["residual"]
    code, out, _ = run_cli(*argv)
    assert "(-ctk turbo4, -ctv auto, --cache-residual 16)" in out
    assert f"+ residual window {memory['residual'] / 1024:.1f} KiB + activations" in out
    # A window longer than the context keeps the context, as the engine does.
    code, out, _ = run_cli(*argv, "--cache-residual", "5000")
    assert "(-ctk turbo4, -ctv auto, --cache-residual 100)" in out


def test_the_check_reads_the_budget_it_is_given(tiny_gguf):
    args = make_parser("generate").parse_args(["generate", "-m", str(tiny_gguf), "-p", "x"])
    resolve_defaults(args, GENERATE_FLAGS, {"LLAMA_ARG_ESTIMATE_MEMORY": "1"})
    resolve_store_flags(args, {})
    err = io.StringIO()
    check_memory(
        args, err, compute_options(1), running_sequences=1, budget=MemoryBudget(2**40, 2**40, 0.9)
    )
    assert "mlxcel: memory: needs " in err.getvalue()
    with pytest.raises(RunError, match=r"but 1\.0 MiB is available"):
        check_memory(
            args,
            io.StringIO(),
            compute_options(1),
            running_sequences=1,
            budget=MemoryBudget(2**40, 2**20, 0.9),
        )


def test_serve_refuses_before_loading_and_stops(tiny_gguf):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["serve", "-m", str(tiny_gguf), "-c", "100000000", "--port", str(port)]
    code, _, err = run_cli(*argv)
    assert code == 1
    listening, refusal = err.splitlines()
    assert listening == f"mlxcel: listening on http://127.0.0.1:{port}"
    assert refusal.startswith(REFUSAL.strip())


# Prints the bytes MLX holds after loading the model at argv[1], and its config's weight bytes.
HELD_BY_LOADING = """
import sys
import mlx.core as mx
from mlxcel_models.loading.loader import load_model
mx.synchronize()
before = mx.get_active_memory()
loaded = load_model(sys.argv[1])
mx.synchronize()
print(mx.get_active_memory() - before, loaded.config.weight_bytes)
"""


@pytest.mark.slow
def test_the_default_model_fits_and_its_estimate_is_what_loading_holds():
    code, out, err = run_cli("inspect", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["fits"] == "all"
    assert report["margin_bytes"] > report["memory"]["total_parallel"]
    # Measured in a process of its own: in this one, earlier tests' arrays freed during the
    # load (a garbage collection, another thread) would count against it.
    measured = subprocess.run(
        [sys.executable, "-c", HELD_BY_LOADING, report["model"]],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    held, weight_bytes = map(int, measured.stdout.split())
    # Exact on this CPU (docs/memory.md); 1% leaves room for allocator rounding elsewhere.
    assert abs(report["weights"]["resident_bytes"] - held) <= 0.01 * held
    assert weight_bytes == report["weights"]["resident_bytes"]


def test_inspect_counts_a_windowed_layer_at_its_window(tmp_path):
    """A llama whose first layer reads the last 5 tokens only: that layer holds its window
    and a chunk (in blocks of 16) per sequence, the other every position."""
    folder = write_sliding_window_model(tmp_path / "llama", TinyConfig(), window=5)
    code, out, err = run_cli(
        "inspect", "-m", str(folder), "-c", "1000", "-np", "2", "-ub", "64", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["windowed_layers"] == {"5": 1}
    auto = next(row for row in report["kv_cache"] if row["type"] == "auto")
    per_layer = auto["bytes_per_token"] // 2
    # Window 5: 4 positions back, a chunk of 64 and the two blocks they start inside of.
    windowed = (-(-(4 + 64 + 32) // 16) + 1) * 16 * per_layer
    assert auto["context_bytes"] == (-(-1000 // 16) + 1) * 16 * per_layer + windowed
    assert report["memory"]["kv_cache"] == auto["context_bytes"]
    code, out, _ = run_cli("inspect", "-m", str(folder), "-c", "1000")
    assert "2 layers, 1 of them reading only the last 5 tokens" in out


def test_inspect_on_a_recurrent_model_shows_its_state_and_no_kv_cache(tmp_path):
    mamba = write_family_model(tmp_path / "mamba2", "mamba2")
    code, out, err = run_cli("inspect", "-m", str(mamba), "-c", "256")
    assert code == 0 and err == ""
    assert "KV cache      none: the layers keep recurrent state only" in out
    assert re.search(r"recurrent state  [\d.]+ KiB per sequence \(2 state layers", out)
    assert "KV heads" not in out and "bytes/token" not in out
    report = json.loads(run_cli("inspect", "-m", str(mamba), "-c", "256", "--json")[1])
    assert report["kv_cache"] == [] and report["kv_heads"] is None
    assert report["memory"]["kv_cache"] == 0 and report["memory"]["states"] > 0
    code, _, err = run_cli("inspect", "-m", str(mamba), "-ctk", "q8_0")
    assert code == 2
    assert err == (
        "mlxcel: error: -ctk/-ctv: mamba2 (mamba2) keeps no KV cache, only recurrent state: "
        "there are no keys or values to store\n"
    )


def test_cache_types_for_a_model_without_kv_are_refused_when_it_loads(tmp_path):
    mamba = write_family_model(tmp_path / "mamba2", "mamba2")
    argv = ("generate", "-m", str(mamba), "-p", "hi", "-n", "1", "-c", "64", "--no-memory-check")
    code, _, err = run_cli(*argv, "-ctv", "q4_0")
    assert code == 2
    assert err.splitlines()[-1] == (
        "mlxcel: error: -ctv/--cache-type-v: mamba2 (mamba2) keeps no KV cache, only "
        "recurrent state: there are no keys or values to store"
    )


def test_a_context_above_the_trained_one_is_warned_of(tiny_gguf):
    # The tiny model is trained for 256 tokens.
    warning = (
        "mlxcel: warning: -c/--ctx-size 1024 is above the model's trained context (256 "
        "tokens): possible training context overflow"
    )
    code, _, err = run_cli("inspect", "-m", str(tiny_gguf), "-c", "1024")
    assert code == 0 and err.startswith(warning)
    assert run_cli("inspect", "-m", str(tiny_gguf), "-c", "256")[2] == ""
    report = json.loads(run_cli("inspect", "-m", str(tiny_gguf), "-c", "1024", "--json")[1])
    assert report["warnings"][0].startswith(warning.removeprefix("mlxcel: "))
    code, _, err = run_cli("generate", "-m", str(tiny_gguf), "-p", "hi", "-n", "1", "-c", "1024")
    assert code == 0 and err.startswith(warning)
