"""`mlxcel generate` over several local ranks on the real SmolLM2 (`--tp 3`, `--pp 2`):
the same greedy text as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Name three primary colors.",
    "Write one sentence about the sea.",
)
RUN_SECONDS = 300
SPLITS = [("--tp", "3"), ("--pp", "2")]


def _generate(*flags: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "MLXCEL_"))}
    # The ranks share the cores; one BLAS thread each keeps them from spinning on each other.
    environ["OPENBLAS_NUM_THREADS"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "mlxcel", "generate", "-c", "512", "--temp", "0", *flags],
        capture_output=True,
        text=True,
        env=environ,
        timeout=RUN_SECONDS,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def batch_flags(smollm2_path, tmp_path_factory) -> tuple[str, ...]:
    prompts_file = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts_file.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    return ("-m", str(smollm2_path), "-n", "12", "--prompts-file", str(prompts_file))


@pytest.fixture(scope="module")
def one_process(batch_flags) -> list[str]:
    """The batch's texts from one process, the reference of every split."""
    alone = [json.loads(line)["text"] for line in _generate(*batch_flags).stdout.splitlines()]
    assert len(alone) == len(PROMPTS) and all(alone)
    return alone


@pytest.mark.slow
@pytest.mark.long
# Three prompts keep two or three steps in flight across the pipeline's stages.
@pytest.mark.parametrize("split", [*SPLITS, ("--pp", "3")], ids=["tp3", "pp2", "pp3"])
def test_a_batch_of_prompts_over_ranks_gives_one_process_text(batch_flags, one_process, split):
    split_text = [
        json.loads(line)["text"] for line in _generate(*batch_flags, *split).stdout.splitlines()
    ]
    assert split_text == one_process


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("split", SPLITS, ids=["tp3", "pp2"])
def test_a_prompt_over_ranks_streams_the_known_answer(smollm2_path, split):
    result = _generate("-m", str(smollm2_path), "-n", "12", "-p", PROMPTS[0], *split)
    assert result.stdout == "The capital of France is Paris.\n"
