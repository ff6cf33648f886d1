"""`-ctk/--cache-type-k` and `-ctv/--cache-type-v`: parsed for `serve` and engine-run
`generate`, mirrored by `LLAMA_ARG_CACHE_TYPE_K/V`, refused when unknown or unusable."""

import io
import json
from dataclasses import replace

import pytest

import mlxcel_core.engine.config as engine_config_module
from mlxcel.cli import main, make_parser
from mlxcel.common.flags import UsageError, resolve_defaults
from mlxcel.serving.serve_command import FLAGS, settings_from
from mlxcel_core.engine.config import default_residual_window
from mlxcel_core.kernels import CUDA

ACCEPTED = "auto, f32, f16, bf16, q8_0, q4_0, turbo2, turbo3, turbo4"


def engine_config(argv, environ):
    args = make_parser("serve").parse_args(["serve", *argv])
    resolve_defaults(args, FLAGS, environ)
    return settings_from(args).engine


def run_cli(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cache_types_default_to_auto_and_come_from_flags_or_the_environment():
    default = engine_config([], {})
    assert (default.cache_type_k, default.cache_type_v) == ("auto", "auto")
    short = engine_config(["-ctk", "q8_0", "-ctv", "turbo4"], {})
    assert (short.cache_type_k, short.cache_type_v) == ("q8_0", "turbo4")
    environ = {"LLAMA_ARG_CACHE_TYPE_K": "turbo3", "LLAMA_ARG_CACHE_TYPE_V": "q4_0"}
    mirrored = engine_config([], environ)
    assert (mirrored.cache_type_k, mirrored.cache_type_v) == ("turbo3", "q4_0")
    winning = engine_config(["--cache-type-k", "f16"], environ)
    assert (winning.cache_type_k, winning.cache_type_v) == ("f16", "q4_0")


@pytest.mark.parametrize(
    ("argv", "environ", "flag"),
    [
        (["-ctk", "q5_1"], {}, "-ctk/--cache-type-k"),
        ([], {"LLAMA_ARG_CACHE_TYPE_V": "int8"}, "-ctv/--cache-type-v"),
    ],
)
def test_an_unknown_cache_type_is_a_usage_error_listing_the_names(argv, environ, flag):
    with pytest.raises(UsageError) as raised:
        engine_config(argv, environ)
    assert str(raised.value).startswith(f"{flag} must be one of {ACCEPTED}")


def test_the_residual_window_comes_from_its_flag_and_needs_a_stored_type():
    assert engine_config([], {}).cache_residual == 0
    windowed = engine_config(["-ctk", "turbo4", "--cache-residual", "16"], {})
    assert windowed.cache_residual == 16 and windowed.num_residual_blocks == 2 * 4 * 2
    long = replace(engine_config(["-ctk", "q8_0", "--cache-residual", "5000"], {}), context_size=64)
    assert (long.cache_residual, long.residual_window) == (5000, 64)
    for argv in (["--cache-residual", "16"], ["-ctk", "f16", "--cache-residual", "16"]):
        with pytest.raises(
            UsageError, match=r"^--cache-residual keeps .* needs -ctk/--cache-type-k"
        ):
            engine_config(argv, {})
    with pytest.raises(UsageError, match=r"^--cache-residual must be >= 0, got -1"):
        engine_config(["-ctv", "q8_0", "--cache-residual", "-1"], {})


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        ([], {"LLAMA_ARG_CACHE_RESIDUAL": "-3"}, "LLAMA_ARG_CACHE_RESIDUAL must be >= 0, got -3"),
        (["--cache-residual", "-1"], {"LLAMA_ARG_CACHE_RESIDUAL": "-3"},
         "--cache-residual must be >= 0, got -1"),
        (["--cache-residual", "16"], {"LLAMA_ARG_CACHE_TYPE_K": "f16"},
         "--cache-residual keeps exact copies beside a quantized cache; it needs "
         "LLAMA_ARG_CACHE_TYPE_K or -ctv/--cache-type-v to be q8_0"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["serve", "inspect"])
def test_a_residual_window_out_of_range_names_the_variable_it_came_from(
    tiny_gguf, command, argv, environ, message
):
    code, out, err = run_cli(command, "-m", str(tiny_gguf), *argv, environ=environ)
    assert (code, out) == (2, "")
    assert err.startswith(f"mlxcel: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "window"),
    [
        ([], 0),
        (["-ctk", "f16", "-ctv", "f16"], 0),
        (["-ctk", "q8_0", "-ctv", "q8_0"], 16),
        (["-ctk", "q4_0", "-ctv", "q4_0"], 16),
        (["-ctk", "q8_0", "-ctv", "turbo4"], 16),
        (["-ctk", "turbo4", "-ctv", "f16"], 16),
        (["-ctk", "turbo4", "-ctv", "turbo4"], 16),
        (["-ctk", "q8_0", "-ctv", "q8_0", "--cache-residual", "0"], 0),
        (["-ctk", "q4_0", "--cache-residual", "32"], 32),
    ],
)
def test_quantized_caches_keep_a_residual_window_by_default(argv, window):
    assert engine_config(argv, {}).cache_residual == window


def test_turbo_keys_and_values_keep_no_window_where_their_decode_kernels_serve(monkeypatch):
    monkeypatch.setattr(engine_config_module, "kernel_backend", lambda device: CUDA)
    assert engine_config(["-ctk", "turbo4", "-ctv", "turbo4"], {}).cache_residual == 0
    assert engine_config(["-ctk", "turbo3", "-ctv", "turbo2"], {}).cache_residual == 0
    assert engine_config(["-ctk", "q8_0", "-ctv", "turbo4"], {}).cache_residual == 16


def test_batch_generate_runs_on_a_quantized_cache(tiny_gguf, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\nthere\n")
    code, out, err = run_cli(
        "generate", "-m", str(tiny_gguf), "--prompts-file", str(prompts), "-n", "3",
        "-ctk", "turbo4", "-ctv", "f16", "--cache-residual", "8",
    )  # fmt: skip
    assert code == 0, err
    assert len([json.loads(line) for line in out.splitlines()]) == 2


def test_generate_says_which_kv_cache_types_and_residual_window_it_ran(tiny_gguf, tmp_path):
    """Last on stderr, after how the weights are held: the window's default differs by
    device."""
    base = ["generate", "-m", str(tiny_gguf), "-p", "hello", "-no-cnv", "--temp", "0", "-n", "2"]
    code, _, err = run_cli(*base, "-ctk", "turbo4", "-ctv", "f32")
    assert code == 0, err
    window = default_residual_window("turbo4", "f32")
    assert err.splitlines()[-1] == f"KV cache: K turbo4, V f32, residual window {window}"
    assert err.splitlines()[-2].startswith("weights: ")
    code, _, err = run_cli(*base)
    assert (code, err.splitlines()[-1]) == (0, "KV cache: K auto, V auto, residual window 0")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\nthere\n")
    code, _, err = run_cli(
        "generate", "-m", str(tiny_gguf), "--prompts-file", str(prompts), "-n", "2",
        "-ctk", "f16", "-ctv", "turbo3", "--cache-residual", "8",
    )  # fmt: skip
    assert (code, err.splitlines()[-1]) == (0, "KV cache: K f16, V turbo3, residual window 8")


def test_the_residual_window_said_is_the_one_kept_at_most_the_context(tiny_gguf, tmp_path):
    window = ["-c", "64", "-ctk", "turbo4", "--cache-residual", "99999999999", "-n", "2"]
    code, _, err = run_cli(
        "generate", "-m", str(tiny_gguf), "-p", "hello", "-no-cnv", "--temp", "0", *window
    )
    assert (code, err.splitlines()[-1]) == (0, "KV cache: K turbo4, V auto, residual window 64")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\nthere\n")
    code, _, err = run_cli(
        "generate", "-m", str(tiny_gguf), "--prompts-file", str(prompts), *window
    )
    assert (code, err.splitlines()[-1]) == (0, "KV cache: K turbo4, V auto, residual window 64")


def test_a_type_the_models_head_dim_cannot_take_is_a_usage_error(tiny_gguf, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    code, _, err = run_cli(
        "generate", "-m", str(tiny_gguf), "--prompts-file", str(prompts), "-ctv", "q8_0"
    )
    assert code == 2
    assert err.startswith("mlxcel: error: ") and "Traceback" not in err
    assert "q8_0 needs a head dim that is a multiple of 32, got head_dim=16" in err


def test_single_prompt_generate_runs_on_a_quantized_cache(tiny_gguf):
    """turbo2 keys change the tiny model's greedy text; f32 keys do not. (No residual
    window: the default one would keep this short text's every position exact.)"""
    base = ["generate", "-m", str(tiny_gguf), "-p", "hello", "-no-cnv", "--temp", "0", "-n", "12"]
    results = {
        cache_type: run_cli(*base, "-ctk", cache_type, "-ctv", "f32", "--cache-residual", "0")
        for cache_type in ("auto", "f32", "turbo2")
    }
    assert all(code == 0 for code, _, _ in results.values()), results
    assert results["f32"][1] == results["auto"][1]
    assert results["turbo2"][1] != results["auto"][1]
