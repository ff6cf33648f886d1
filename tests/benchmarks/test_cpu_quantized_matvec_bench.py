"""The CPU kernel's benchmark prints one line per shape and row count, each with both
products timed."""

import pytest

from mlxcel_core.kernels import cpu_matvec

from benchmark_scripts import load_benchmark


@pytest.mark.skipif(not cpu_matvec.available(), reason="the CPU kernel is not built here")
def test_the_benchmark_times_every_shape_at_every_row_count(capsys):
    bench = load_benchmark("cpu_quantized_matvec")
    bench.main(["--rows", "1,2", "--calls", "1", "--repeats", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| weight |")
    measured = rows[1:]
    assert len(measured) == 2 * len(bench.SHAPES)
    for line in measured:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert float(cells[3]) > 0 and float(cells[4]) > 0 and cells[7].endswith("x")
