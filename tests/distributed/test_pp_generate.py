"""`mlxcel generate --pp 2` on the real SmolLM2: two local stages over loopback give the
same greedy text as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Name three primary colors.",
    "Write one sentence about the sea.",
)
RUN_SECONDS = 240


def _generate(*flags: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "MLXCEL_"))}
    # Two ranks share the cores; one BLAS thread each keeps them from spinning on each other.
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


def test_pp_2_generates_what_one_process_does_for_a_batch_of_prompts(smollm2_path, tmp_path):
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    flags = ("-m", str(smollm2_path), "-n", "12", "--prompts-file", str(prompts_file))
    alone = [json.loads(line)["text"] for line in _generate(*flags).stdout.splitlines()]
    split = _generate(*flags, "--pp", "2").stdout.splitlines()
    split = [json.loads(line)["text"] for line in split]
    assert len(alone) == len(PROMPTS) and all(alone)
    assert split == alone


def test_pp_2_streams_the_known_answer(smollm2_path):
    result = _generate("-m", str(smollm2_path), "-n", "12", "-p", PROMPTS[0], "--pp", "2")
    assert result.stdout == "The capital of France is Paris.\n"
