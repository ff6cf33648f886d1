"""A surgery plan: the weight edits a surgery file asks for, in file order.

Every part remembers where the file gave it (`Where`), so that checks against the model,
which can only run once it is built, still name the file and line.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.")
"""mlx-lm's name prefix of a decoder layer's tensors; group 1 is the layer index."""


@dataclass(frozen=True)
class Where:
    """A line of a surgery file (1-based)."""

    file: Path
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Pattern:
    """A tensor name pattern: a shell-style glob (`*` crosses dots), or a Python regular
    expression matched against the whole name."""

    text: str
    is_regex: bool
    where: Where

    def matches(self, name: str) -> bool:
        if self.is_regex:
            return re.fullmatch(self.text, name) is not None
        return fnmatch.fnmatchcase(name, self.text)


@dataclass(frozen=True)
class IndexRange:
    """Indices (of layers, heads or channels) `first` to `last`, both included."""

    first: int
    last: int
    where: Where

    def __contains__(self, layer: int) -> bool:
        return self.first <= layer <= self.last

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


@dataclass(frozen=True)
class Selection:
    """Which tensors an edit touches: those matching any pattern (all when there are
    none), restricted to tensors of the given decoder layers when ranges are given."""

    patterns: tuple[Pattern, ...] = ()
    layers: tuple[IndexRange, ...] = ()

    def includes_layer(self, layer: int) -> bool:
        return not self.layers or any(layer in r for r in self.layers)

    def layer_allowed(self, name: str) -> bool:
        """True for a tensor of a selected layer, or any tensor when no layers are given."""
        if not self.layers:
            return True
        match = LAYER_NAME.match(name)
        return match is not None and self.includes_layer(int(match[1]))


class PruneTarget(StrEnum):
    HEADS = "heads"
    CHANNELS = "channels"
    LAYERS = "layers"


@dataclass(frozen=True)
class ScaleEdit:
    """Multiply the selected tensors by `factor`."""

    where: Where
    selection: Selection
    factor: float


@dataclass(frozen=True)
class AddEdit:
    """Add `value` to the selected tensors, or the same-named tensors of checkpoint
    `source` (or its one tensor `source_tensor`, to every selected tensor)."""

    where: Where
    selection: Selection
    value: float | None = None
    source: Path | None = None
    source_tensor: str | None = None


@dataclass(frozen=True)
class PruneEdit:
    """Zero attention heads, MLP channels or whole layers of the selected layers
    (all layers when the selection gives none); `indices` are the heads or channels."""

    where: Where
    selection: Selection
    target: PruneTarget
    indices: tuple[IndexRange, ...] = ()


@dataclass(frozen=True)
class ReplaceEdit:
    """Take the selected tensors from checkpoint `source`."""

    where: Where
    selection: Selection
    source: Path


@dataclass(frozen=True)
class InterpolateEdit:
    """Blend the selected tensors with checkpoint `source`'s: (1 - alpha) * own + alpha *
    source's."""

    where: Where
    selection: Selection
    source: Path
    alpha: float


Edit = ScaleEdit | AddEdit | PruneEdit | ReplaceEdit | InterpolateEdit


@dataclass(frozen=True)
class SurgeryPlan:
    """The edits of one surgery file, applied in order while a model loads."""

    path: Path
    edits: tuple[Edit, ...]

    @property
    def sources(self) -> dict[Path, Where]:
        """The other checkpoints the edits read, each with the first edit reading it."""
        found: dict[Path, Where] = {}
        for edit in self.edits:
            source = source_of(edit)
            if source is not None:
                found.setdefault(source, edit.where)
        return found


def source_of(edit: Edit) -> Path | None:
    """The checkpoint `edit` reads, if any."""
    if isinstance(edit, AddEdit | ReplaceEdit | InterpolateEdit):
        return edit.source
    return None
