"""benchmarks/pipeline_throughput.py: its prompts, its reading of generate's summary, and
the source path that runs another tree."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "pipeline_throughput.py"
_SPEC = importlib.util.spec_from_file_location("pipeline_throughput", _PATH)
pipeline_throughput = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(pipeline_throughput)


def test_the_workloads_hold_sixteen_prompts_of_their_kind() -> None:
    short = pipeline_throughput.workload_prompts("short")
    long = pipeline_throughput.workload_prompts("long")
    assert len(short) == len(long) == 16
    assert len(set(short)) == 8
    assert len(set(long)) == 16
    assert all(len(prompt.split()) == 301 for prompt in long)  # "Summarise:" and 300 words


def test_the_summary_line_gives_prompt_tokens_and_seconds() -> None:
    stderr = (
        "loading:  97%|#########| 29/30\r"
        "8 prompts: 2448 prompt tokens (128 from the prefix cache), 64 generated in 46.74 s "
        "(1.4 tokens/s overall)\n"
    )
    assert pipeline_throughput.parse_summary(stderr) == (2448, 46.74)
    with pytest.raises(ValueError, match="no summary line"):
        pipeline_throughput.parse_summary("mlxcel: error: rank 1 exited with code 1\n")


def test_a_baseline_tree_puts_its_packages_and_app_on_the_path(tmp_path) -> None:
    for folder in ("packages/mlxcel-core/src", "packages/mlxcel-models/src", "apps/mlxcel/src"):
        (tmp_path / folder).mkdir(parents=True)
    entries = pipeline_throughput.source_path(tmp_path).split(os.pathsep)
    assert entries == [
        str(tmp_path / "packages/mlxcel-core/src"),
        str(tmp_path / "packages/mlxcel-models/src"),
        str(tmp_path / "apps/mlxcel/src"),
    ]
    with pytest.raises(ValueError, match="no packages"):
        pipeline_throughput.source_path(tmp_path / "apps")
