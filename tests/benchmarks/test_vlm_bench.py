"""benchmarks/vlm_bench.py: the pictures, the spread and the table's ratios."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
from PIL import Image

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load_vlm_bench():
    # vlm_bench imports random_vlm by its bare name, as it does when run as a script.
    sys.path.insert(0, str(_BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("vlm_bench", _BENCHMARKS / "vlm_bench.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["vlm_bench"] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(_BENCHMARKS))
    return module


vlm_bench = _load_vlm_bench()


def test_pictures_are_distinct_and_the_same_on_every_run(tmp_path: Path) -> None:
    paths = vlm_bench.write_pictures(tmp_path / "first", 3)
    first = [np.asarray(Image.open(path)) for path in paths]
    again = vlm_bench.write_pictures(tmp_path / "again", 3)

    assert first[0].shape == (vlm_bench.PICTURE_HEIGHT, vlm_bench.PICTURE_WIDTH, 3)
    assert not np.array_equal(first[0], first[1])
    assert all(
        np.array_equal(np.asarray(Image.open(path)), pixels)
        for path, pixels in zip(again, first, strict=True)
    )


def test_spread_is_the_median_and_the_range() -> None:
    assert vlm_bench.spread([3.0, 1.0, 2.0, 10.0]) == "2.5 (1-10)"


def test_ratios_favour_mlxcel_above_one_for_images_per_second_below_one_for_ttft() -> None:
    samples = {
        "mlxcel": vlm_bench.Samples([1.0, 1.0, 3.0], [3.0, 3.0, 9.0], 822),
        "mlx-vlm": vlm_bench.Samples([2.0, 2.0, 2.0], [6.0, 5.0, 6.0], 822),
    }

    rows = vlm_bench.table_rows(448, samples)

    assert rows[0] == "| 448² | mlxcel | 1 (0.333-1) | 3 (3-9) | 822 |"
    assert rows[-1] == "| 448² | mlxcel / mlx-vlm | 2.00x | 0.50x | |"
