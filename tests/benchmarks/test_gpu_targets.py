"""benchmarks/gpu_targets.py end to end on tiny shapes: every row is measured through both
implementations and lands in the markdown and JSON files with a consistent verdict."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load_benchmark

for sibling in ("random_model", "batched_decode", "device_measures", "target_models"):
    load_benchmark(sibling)
load_benchmark("target_report")
gpu_targets = load_benchmark("gpu_targets")


def test_tiny_run_writes_every_target_row(tmp_path, capsys) -> None:
    out = tmp_path / "targets.md"

    gpu_targets.main(["--tiny", "--out", str(out)])

    report = json.loads(out.with_suffix(".json").read_text())
    assert report["copy_bandwidth_bytes_per_second"] > 0
    keys = [row["key"] for row in report["rows"]]
    # The speculative key gives two rows: the verification's cost and the speed-up.
    assert keys == [*gpu_targets.ROW_KEYS[:7], "speculative_8b", *gpu_targets.ROW_KEYS[7:]]
    for row in report["rows"]:
        assert row["ours"] > 0 and row["theirs"] > 0
        assert row["ratio"] == pytest.approx(row["ours"] / row["theirs"])
        bound = float(row["target"].split()[1].rstrip("x"))
        within = row["ratio"] <= bound if row["target"].startswith("<=") else row["ratio"] >= bound
        assert row["met"] == (within and _share_met(row))
    table = out.read_text()
    assert table.count("\n| ") == len(report["rows"]) + 1
    assert "| decode, batch 1, 8B 4-bit |" in capsys.readouterr().out


def _share_met(row: dict) -> bool:
    if "roofline" not in row["target"]:
        return True
    wanted = float(row["target"].split(">= ")[2].split("%")[0]) / 100
    return row["share"] >= wanted


def test_unknown_rows_are_refused(tmp_path) -> None:
    with pytest.raises(SystemExit):
        gpu_targets.main(["--tiny", "--out", str(tmp_path / "t.md"), "--rows", "decode_2b"])
