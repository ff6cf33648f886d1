"""Plain-text tables for listings on a terminal."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """`header` and `rows` in left-aligned columns two spaces apart, one line each."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    )


def format_size(num_bytes: int) -> str:
    """A byte count in binary units: `512 B`, `1.5 KiB`, `4.2 GiB`."""
    size, unit = float(num_bytes), "B"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, larger
    return f"{num_bytes} B" if unit == "B" else f"{size:.1f} {unit}"
