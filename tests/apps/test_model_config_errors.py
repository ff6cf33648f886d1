"""A config.json that mlx-lm's model classes cannot use is one line naming the key and the
file, exit 1, in every command that loads or sizes a model, with or without the memory
check; so is a recurrent model given as a draft model."""

from __future__ import annotations

import io
import socket

import pytest

from mlxcel.cli import main

from family_folders import edited_copy, write_family_model


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ={}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {
        name: write_family_model(root / name, name)
        for name in ("qwen3_moe", "mamba2", "gemma3_text")
    }


def _without(key):
    return lambda config: config.pop(key)


def _with(**values):
    return lambda config: config.update(values)


BAD_CONFIGS = {
    "missing": ("qwen3_moe", _without("num_experts"), "lacks a hyperparameter: 'num_experts'"),
    "missing_state": ("mamba2", _without("state_size"), "lacks a hyperparameter: 'state_size'"),
    "wrong_type": ("qwen3_moe", _with(rope_theta="big"), "rope_theta must be a number, got 'big'"),
    "zero_heads": (
        "qwen3_moe",
        _with(num_key_value_heads=0),
        "num_key_value_heads must be a positive",
    ),
    "experts": (
        "qwen3_moe",
        _with(num_experts_per_tok=99),
        "num_experts_per_tok must be between 1 and num_experts (4), got 99",
    ),
    "model_type": ("qwen3_moe", _with(model_type=["qwen3_moe"]), "'model_type' must be a string"),
    "window": ("gemma3_text", _with(sliding_window=0), "sliding_window must be a positive integer"),
}


@pytest.fixture(scope="module")
def bad_folders(families, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    return {
        name: edited_copy(families[family], root / name, edit)
        for name, (family, edit, _) in BAD_CONFIGS.items()
    }


def _command(command: str, model: str) -> list[str]:
    return {
        "generate": ["generate", "-m", model, "-p", "hi", "-n", "2"],
        "generate-unchecked": ["generate", "-m", model, "-p", "hi", "-n", "2", "--no-memory-check"],
        "run": ["run", model, "-p", "hi", "-n", "2"],
        "inspect": ["inspect", "-m", model],
        "bench": ["bench", "-m", model, "-p", "4", "-n", "2", "-r", "1"],
        "serve": ["serve", "-m", model, "--port", _free_port()],
        "serve-unchecked": ["serve", "-m", model, "--port", _free_port(), "--no-memory-check"],
    }[command]


@pytest.mark.parametrize("bad", sorted(BAD_CONFIGS))
@pytest.mark.parametrize(
    "command",
    ["generate", "generate-unchecked", "run", "inspect", "bench", "serve", "serve-unchecked"],
)
def test_a_bad_config_is_one_line_naming_the_key_and_file(bad_folders, bad, command):
    folder = bad_folders[bad]
    code, _, err = run_cli(*_command(command, str(folder)))
    assert code == 1, err
    (error,) = [line for line in err.splitlines() if line.startswith("mlxcel: error: ")]
    assert "Traceback" not in err
    assert str(folder / "config.json") in error
    assert BAD_CONFIGS[bad][2] in error


def test_a_recurrent_draft_model_is_refused_by_name(families, tiny_safetensors):
    code, _, err = run_cli(
        "generate", "-m", str(tiny_safetensors), "-md", str(families["mamba2"]), "-p", "hi"
    )
    assert code == 2
    assert err.splitlines()[-1] == (
        f"mlxcel: error: -md/--model-draft: {families['mamba2']} (mamba2) keeps recurrent "
        "state, which cannot be rolled back past rejected draft tokens; a draft model must "
        "keep only a KV cache"
    )
