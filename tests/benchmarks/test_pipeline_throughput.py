"""benchmarks/pipeline_throughput.py: its prompts, its reading of generate's summary, the
source path that runs another tree, the order of its runs, and the flags it passes on to
generate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmark_scripts import load_benchmark

pipeline_throughput = load_benchmark("pipeline_throughput")


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


def test_the_flags_after_a_double_dash_go_to_generate() -> None:
    argv = ["short", "--rounds", "2", "--baseline", "/tmp/old", "--", "-m", "MODEL", "-no-cnv"]
    _, args = pipeline_throughput.parse_args(argv)
    assert (args.workload, args.rounds, args.baseline) == ("short", 2, Path("/tmp/old"))
    assert args.generate_flags == ["-m", "MODEL", "-no-cnv"]
    _, args = pipeline_throughput.parse_args(["long"])
    assert args.generate_flags == []
    with pytest.raises(SystemExit):  # generate's flags only after the double dash
        pipeline_throughput.parse_args(["long", "-m", "MODEL"])


def test_the_two_trees_take_turns_after_one_process() -> None:
    variants = ["one process", "this tree", "baseline"]
    assert pipeline_throughput.round_order(variants, 1) == variants
    assert pipeline_throughput.round_order(variants, 2) == ["one process", "baseline", "this tree"]
    assert pipeline_throughput.round_order(variants, 3) == variants
    assert pipeline_throughput.round_order(variants[:2], 2) == variants[:2]
