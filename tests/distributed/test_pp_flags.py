"""`--pp N` is refused at start, before any rank starts or any weight loads, when the model
or the other flags cannot use it; the families that allow it are the stage's families."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
from cli_runs import run_mlxcel

from mlxcel.common.flags import UsageError
from mlxcel.distributed.parallel_modes import PIPELINE_PARALLEL
from mlxcel_distributed import PIPELINE_FAMILIES
from mlxcel_models.memory import read_model_inventory
from mlxcel_models.metadata import all_families

TOO_MANY_STAGES = "mlxcel: error: --pp 31: the model has 30 layers, so at most 30 stages\n"


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_more_stages_than_smollm2_has_layers_exits_2(smollm2_path, no_spawning, command):
    prompt = ["-p", "hi"] if command == "generate" else []
    code, err = run_mlxcel([command, "-m", str(smollm2_path), "--pp", "31", *prompt])
    assert (code, err) == (2, TOO_MANY_STAGES)


def test_the_environment_and_the_vllm_spelling_set_the_size(smollm2_path, no_spawning):
    argv = ["generate", "-m", str(smollm2_path), "-p", "hi"]
    assert run_mlxcel(argv, {"MLXCEL_PP": "31"}) == (2, TOO_MANY_STAGES)
    assert run_mlxcel([*argv, "--pipeline-parallel-size", "31"]) == (2, TOO_MANY_STAGES)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pp", "0"], "--pp must be >= 1, got 0"),
        (["--tp", "3", "--pp", "2"], "--tp and --pp cannot be combined: use one of them"),
        (["--pp", "2", "--prompt-lookup-max", "3"], "--pp does not support speculative decoding"),
        (["--pp", "2", "--lora", "{adapter}"], "--pp needs LoRA adapters fused"),
    ],
)
def test_unsupported_combinations_are_refused(smollm2_path, tmp_path, no_spawning, flags, message):
    flags = [flag.format(adapter=tmp_path) for flag in flags]
    code, err = run_mlxcel(["generate", "-m", str(smollm2_path), "-p", "hi", *flags])
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_a_family_without_stages_is_refused_from_its_headers(smollm2_path):
    inventory = read_model_inventory(smollm2_path)
    PIPELINE_PARALLEL.check_model(inventory, 30)
    family = replace(inventory.family, model_type="gemma", supports_pipeline_parallel=False)
    with pytest.raises(UsageError, match=r"^--pp: the gemma family does not support pipeline"):
        PIPELINE_PARALLEL.check_model(replace(inventory, family=family), 2)


def test_families_marked_for_pipeline_parallel_are_the_stage_families():
    marked = {name for name, family in all_families().items() if family.supports_pipeline_parallel}
    assert marked == set(PIPELINE_FAMILIES)


@pytest.mark.slow
@pytest.mark.long
def test_a_stage_that_dies_while_starting_ends_rank_0_with_one_line(smollm2_path, tmp_path):
    # Every process but rank 0 ends at interpreter start-up with status 7.
    (tmp_path / "sitecustomize.py").write_text(
        "import os\nif os.environ.get('MLX_RANK', '0') != '0':\n    os._exit(7)\n",
        encoding="utf-8",
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "MLXCEL_"))}
    result = subprocess.run(
        [sys.executable, "-m", "mlxcel", "generate", "-m", str(smollm2_path), "--pp", "2",
         "-p", "hi"],
        capture_output=True,
        text=True,
        env={**environ, "PYTHONPATH": str(tmp_path)},
        timeout=120,
    )  # fmt: skip
    assert (result.returncode, result.stderr) == (1, "mlxcel: error: rank 1 exited with code 7\n")
