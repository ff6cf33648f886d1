"""The target table of `gpu_targets.py`: its rows, and the markdown and JSON files that are
rewritten after each row, so that a run cut short keeps what it measured."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import mlx.core as mx


@dataclass(frozen=True)
class TargetRow:
    """One measured target.

    Attributes:
        name: what was measured.
        ours: mlxcel's figure, in `unit`.
        theirs: the reference's figure, in `unit`.
        unit: "tok/s", "ms" or "x".
        reference: what `theirs` is.
        ratio: ours / theirs.
        share: mlxcel's share of the HBM roofline, where it applies.
        target: the target, in words.
        met: whether the target is met.
        note: anything the figures need beside them.
    """

    name: str
    ours: float
    theirs: float
    unit: str
    reference: str
    ratio: float
    share: float | None
    target: str
    met: bool
    note: str = ""

    @classmethod
    def ratio_row(
        cls,
        name: str,
        ours: float,
        theirs: float,
        unit: str,
        reference: str,
        *,
        target: float,
        share: float | None = None,
        min_share: float | None = None,
        note: str = "",
    ) -> TargetRow:
        """A row whose target is ours / theirs >= `target`, and a roofline share of at
        least `min_share` when given."""
        ratio = ours / theirs
        wanted = f">= {target}x"
        met = ratio >= target
        if min_share is not None:
            wanted += f" and >= {min_share:.0%} of the roofline"
            met = met and share is not None and share >= min_share
        return cls(name, ours, theirs, unit, reference, ratio, share, wanted, met, note)

    @classmethod
    def cost_row(
        cls,
        name: str,
        ours: float,
        theirs: float,
        unit: str,
        reference: str,
        *,
        most: float,
        note: str = "",
    ) -> TargetRow:
        """A row whose target is ours / theirs <= `most` (a cost against another)."""
        ratio = ours / theirs
        return cls(
            name, ours, theirs, unit, reference, ratio, None, f"<= {most}x", ratio <= most, note
        )


def _figure(value: float, unit: str) -> str:
    return f"{value:,.2f} {unit}" if unit in ("ms", "x") else f"{value:,.1f} {unit}"


class Report:
    """The rows measured so far, written to `path` (markdown) and `path.with_suffix(".json")`
    each time one is added.

    Args:
        path: the markdown file.
        scale: the run's settings (a dataclass), recorded in both files.
    """

    def __init__(self, path: Path, *, scale: object) -> None:
        self.path = path
        self.start = time.perf_counter()
        self.rows: list[tuple[str, TargetRow]] = []
        self.meta = {
            "device": mx.device_info().get("device_name", str(mx.default_device())),
            "default_device": str(mx.default_device()),
            "mlx": mx.__version__,
            "mlx_lm": version("mlx-lm"),
            "scale": asdict(scale),
            "copy_bandwidth_bytes_per_second": None,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        self.write()

    def set_bandwidth(self, bytes_per_second: float) -> None:
        self.meta["copy_bandwidth_bytes_per_second"] = bytes_per_second
        self.progress(f"copy bandwidth {bytes_per_second / 1e12:.3f} TB/s (read + written)")
        self.write()

    def progress(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.start:7.1f} s] {message}", flush=True)

    def add(self, key: str, row: TargetRow) -> None:
        self.rows.append((key, row))
        self.progress(self._line(row))
        self.write()

    def _line(self, row: TargetRow) -> str:
        share = "" if row.share is None else f"{row.share:.1%}"
        verdict = "met" if row.met else "not met"
        return (
            f"| {row.name} | {_figure(row.ours, row.unit)} | {_figure(row.theirs, row.unit)} "
            f"({row.reference}) | {row.ratio:.2f}x | {share} | {row.target} | {verdict} | "
            f"{row.note} |"
        )

    def markdown(self) -> str:
        bandwidth = self.meta["copy_bandwidth_bytes_per_second"]
        lines = [
            f"Device: {self.meta['device']} ({self.meta['default_device']}); MLX "
            f"{self.meta['mlx']}, mlx-lm {self.meta['mlx_lm']}; copy bandwidth "
            + ("not measured" if bandwidth is None else f"{bandwidth / 1e12:.3f} TB/s")
            + f"; {time.perf_counter() - self.start:.0f} s so far.",
            "",
            "| row | mlxcel | reference | ratio | roofline | target | verdict | note |",
            "|---|---|---|---|---|---|---|---|",
            *(self._line(row) for _, row in self.rows),
        ]
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        self.path.write_text(self.markdown())
        rows = [{"key": key, **asdict(row)} for key, row in self.rows]
        self.path.with_suffix(".json").write_text(
            json.dumps({**self.meta, "rows": rows}, indent=2) + "\n"
        )
