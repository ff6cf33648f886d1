"""`--tp N` is refused at start, before any rank starts or any weight loads, when the model
or the other flags cannot use it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from cli_runs import run_mlxcel

from mlxcel_distributed import TensorParallelError, check_tp_size, valid_tp_sizes
from mlxcel_models.memory import read_model_inventory

HEAD_COUNT_MESSAGE = (
    "mlxcel: error: --tp 2: the model's 9 query heads and 3 key/value heads do not divide "
    "by 2; valid sizes: 1, 3\n"
)


def test_smollm2_sizes_come_from_its_header(smollm2_path):
    architecture = read_model_inventory(smollm2_path).architecture
    assert valid_tp_sizes(architecture) == [1, 3]
    check_tp_size(architecture, 3)
    message = "9 query heads, 3 key/value heads and 1536 MLP width do not divide by 5"
    with pytest.raises(TensorParallelError, match=message):
        check_tp_size(architecture, 5)


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_tp_2_on_smollm2_exits_2_with_the_head_counts(smollm2_path, no_spawning, command):
    prompt = ["-p", "hi"] if command == "generate" else []
    code, err = run_mlxcel([command, "-m", str(smollm2_path), "--tp", "2", *prompt])
    assert (code, err) == (2, HEAD_COUNT_MESSAGE)


def test_the_environment_and_the_vllm_spelling_set_the_size(smollm2_path, no_spawning):
    argv = ["generate", "-m", str(smollm2_path), "-p", "hi"]
    assert run_mlxcel(argv, {"MLXCEL_TP": "2"}) == (2, HEAD_COUNT_MESSAGE)
    assert run_mlxcel([*argv, "--tensor-parallel-size", "2"]) == (2, HEAD_COUNT_MESSAGE)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tp", "0"], "--tp must be >= 1, got 0"),
        (["--tp", "3", "--prompt-lookup-max", "3"], "--tp does not support speculative decoding"),
        (["--tp", "3", "--lora", "{adapter}"], "--tp needs LoRA adapters fused"),
    ],
)
def test_unsupported_combinations_are_refused(smollm2_path, tmp_path, no_spawning, flags, message):
    flags = [flag.format(adapter=tmp_path) for flag in flags]
    code, err = run_mlxcel(["generate", "-m", str(smollm2_path), "-p", "hi", *flags])
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_a_rank_that_dies_while_starting_ends_rank_0_with_one_line(smollm2_path, tmp_path):
    # Every process but rank 0 ends at interpreter start-up with status 7.
    (tmp_path / "sitecustomize.py").write_text(
        "import os\nif os.environ.get('MLX_RANK', '0') != '0':\n    os._exit(7)\n",
        encoding="utf-8",
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "MLXCEL_"))}
    result = subprocess.run(
        [sys.executable, "-m", "mlxcel", "generate", "-m", str(smollm2_path), "--tp", "3",
         "-p", "hi"],
        capture_output=True,
        text=True,
        env={**environ, "PYTHONPATH": str(tmp_path)},
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert re.fullmatch(r"mlxcel: error: rank [12] exited with code 7\n", result.stderr)
