"""Resolving an edit's selection against a model's tensor names, with errors at the line
of the pattern or range that does not fit."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcel_models.surgery.errors import SurgeryError
from mlxcel_models.surgery.plan import IndexRange, Selection


def check_ranges(ranges: Sequence[IndexRange], count: int, what: str) -> None:
    """Raise unless every range lies in [0, count).

    Raises:
        SurgeryError: a range reaches past the last index; names its line.
    """
    for index_range in ranges:
        if index_range.last >= count:
            raise SurgeryError(
                f"{index_range.where}: {what} {index_range}: outside the model, which has "
                f"{count} {what} (0-{count - 1})"
            )


def select_tensors(selection: Selection, names: Sequence[str], num_layers: int) -> list[str]:
    """The names (in model order) the selection picks among `names`.

    Args:
        selection: patterns and layer ranges; no patterns selects every tensor of the
            layers.
        names: the model's tensor names, mlx-lm style (`model.layers.3.mlp.up_proj.weight`).
        num_layers: the model's decoder layers, for the range check.

    Raises:
        SurgeryError: a layer range is outside the model, or a pattern matches no tensor
            (of the selected layers); names the line and the pattern.
    """
    check_ranges(selection.layers, num_layers, "layers")
    candidates = [name for name in names if selection.layer_allowed(name)]
    if not selection.patterns:
        return candidates
    for pattern in selection.patterns:
        if not any(pattern.matches(name) for name in candidates):
            kind = "regex" if pattern.is_regex else "pattern"
            layers = ", ".join(map(str, selection.layers))
            scope = f" in layers {layers}" if layers else ""
            raise SurgeryError(f"{pattern.where}: {kind} '{pattern.text}' matches no tensor{scope}")
    return [name for name in candidates if any(p.matches(name) for p in selection.patterns)]
