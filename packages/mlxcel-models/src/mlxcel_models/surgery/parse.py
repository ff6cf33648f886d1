"""Reading a surgery file: YAML in, a validated `SurgeryPlan` out, every error at its line.

The file is composed into YAML nodes (not loaded into plain values) so that each value
keeps its position; checks that need the model run later, in `apply`, with the same
positions.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from mlxcel_models.surgery.errors import SurgeryError
from mlxcel_models.surgery.plan import (
    AddEdit,
    Edit,
    IndexRange,
    InterpolateEdit,
    Pattern,
    PruneEdit,
    PruneTarget,
    ReplaceEdit,
    ScaleEdit,
    Selection,
    SurgeryPlan,
    Where,
)

_SELECTION_KEYS = ("tensors", "regex", "layers")
_OP_KEYS = {
    "scale": ("factor",),
    "add": ("value", "from", "tensor"),
    "prune": ("heads", "channels"),
    "replace": ("from",),
    "interpolate": ("from", "alpha"),
}
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
# YAML 1.2's float: PyYAML follows YAML 1.1, which reads `1e-3` (no dot) as a string.
_YAML12_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")


def read_surgery_file(path: str | Path) -> SurgeryPlan:
    """Read and validate a surgery file (format: docs/surgery.md).

    Checks everything that does not need the model: the YAML, the operations and their
    keys, numbers, index ranges, regular expressions, and that the checkpoints named by
    `from` exist (relative paths are taken from the file's folder).

    Raises:
        SurgeryError: the file cannot be read or is invalid; the message starts with
            `FILE:LINE`.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SurgeryError(f"cannot read surgery file {path}: {error}") from error
    return parse_surgery(text, path)


def parse_surgery(text: str, path: Path) -> SurgeryPlan:
    """Validate surgery file `text`, read from `path` (for messages and relative paths).

    Raises:
        SurgeryError: as `read_surgery_file`.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        line = error.problem_mark.line + 1 if error.problem_mark else 1
        raise SurgeryError(f"{path}:{line}: not valid YAML: {error.problem}") from error
    return _Reader(path).plan(root)


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def where(self, node: yaml.Node) -> Where:
        return Where(self.path, node.start_mark.line + 1)

    def error(self, node: yaml.Node, message: str) -> SurgeryError:
        return SurgeryError(f"{self.where(node)}: {message}")

    def plan(self, root: yaml.Node | None) -> SurgeryPlan:
        if root is None:
            raise SurgeryError(f"{self.path}:1: the file is empty; it needs an 'edits' list")
        fields = self.mapping(root, "the file")
        unknown = [key for key in fields if key != "edits"]
        if unknown:
            raise self.error(fields[unknown[0]][0], f"unknown key '{unknown[0]}'; expected 'edits'")
        if "edits" not in fields:
            raise self.error(root, "the file needs an 'edits' list")
        edits_node = fields["edits"][1]
        if not isinstance(edits_node, yaml.SequenceNode) or not edits_node.value:
            raise self.error(edits_node, "'edits' must be a non-empty list of edits")
        return SurgeryPlan(self.path, tuple(self.edit(node) for node in edits_node.value))

    def mapping(self, node: yaml.Node, what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """Key -> (key node, value node) of a mapping node with string keys."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{what} must be a mapping of keys to values")
        fields: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node)
            if not isinstance(key, str):
                raise self.error(key_node, f"keys must be names, got {key!r}")
            if key in fields:
                raise self.error(key_node, f"key '{key}' is given twice")
            fields[key] = (key_node, value_node)
        return fields

    def scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, "expected a single value, not a list or mapping")
        return yaml.SafeLoader("").construct_object(node)

    def edit(self, node: yaml.Node) -> Edit:
        fields = self.mapping(node, "an edit")
        if "op" not in fields:
            raise self.error(node, f"the edit has no 'op'; one of {', '.join(_OP_KEYS)}")
        op_node = fields["op"][1]
        op = self.scalar(op_node)
        if op not in _OP_KEYS:
            raise self.error(op_node, f"unknown op {op!r}; expected one of {', '.join(_OP_KEYS)}")
        allowed = ("op", *_SELECTION_KEYS, *_OP_KEYS[op])
        for key, (key_node, _) in fields.items():
            if key not in allowed:
                raise self.error(
                    key_node, f"'{key}' is not a key of a {op} edit; allowed: {', '.join(allowed)}"
                )
        values = {key: value for key, (_, value) in fields.items()}
        where = self.where(node)
        selection = self.selection(values)
        if op == "prune":
            return self.prune(node, where, selection, values)
        if not selection.patterns and not selection.layers:
            raise self.error(node, f"a {op} edit needs 'tensors', 'regex' or 'layers'")
        if op == "scale":
            return ScaleEdit(where, selection, self.number(self.required(node, values, "factor")))
        if op == "add":
            return self.add(node, where, selection, values)
        source = self.checkpoint(self.required(node, values, "from"))
        if op == "replace":
            return ReplaceEdit(where, selection, source)
        alpha_node = self.required(node, values, "alpha")
        alpha = self.number(alpha_node)
        if not 0.0 <= alpha <= 1.0:
            raise self.error(alpha_node, f"alpha must be in [0, 1], got {alpha}")
        return InterpolateEdit(where, selection, source, alpha)

    def required(self, edit: yaml.Node, values: dict[str, yaml.Node], key: str) -> yaml.Node:
        if key not in values:
            raise self.error(edit, f"the edit needs '{key}'")
        return values[key]

    def selection(self, values: dict[str, yaml.Node]) -> Selection:
        patterns = [
            Pattern(text, key == "regex", self.where(item))
            for key in ("tensors", "regex")
            if key in values
            for text, item in self.strings(values[key], key)
        ]
        for pattern in patterns:
            if pattern.is_regex:
                try:
                    re.compile(pattern.text)
                except re.error as error:
                    raise SurgeryError(
                        f"{pattern.where}: regex '{pattern.text}' is invalid: {error}"
                    ) from error
        layers = self.ranges(values["layers"], "layers") if "layers" in values else ()
        return Selection(tuple(patterns), layers)

    def strings(self, node: yaml.Node, key: str) -> list[tuple[str, yaml.Node]]:
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        if not items:
            raise self.error(node, f"'{key}' is an empty list")
        found = []
        for item in items:
            text = self.scalar(item)
            if not isinstance(text, str) or not text:
                raise self.error(item, f"'{key}' takes name patterns, got {text!r}")
            found.append((text, item))
        return found

    def ranges(self, node: yaml.Node, key: str) -> tuple[IndexRange, ...]:
        """`3`, `2-5` or a list of those."""
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        if not items:
            raise self.error(node, f"'{key}' is an empty list")
        return tuple(self.range(item, key) for item in items)

    def range(self, node: yaml.Node, key: str) -> IndexRange:
        value = self.scalar(node)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return IndexRange(value, value, self.where(node))
        match = _RANGE.match(value) if isinstance(value, str) else None
        if match is None or int(match[1]) > int(match[2]):
            raise self.error(
                node, f"'{key}' takes indices >= 0 or ranges FIRST-LAST, got {value!r}"
            )
        return IndexRange(int(match[1]), int(match[2]), self.where(node))

    def number(self, node: yaml.Node) -> float:
        value = self.scalar(node)
        if isinstance(value, str) and node.style is None and _YAML12_FLOAT.match(value):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(node, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            raise self.error(node, f"expected a finite number, got {value}")
        return float(value)

    def checkpoint(self, node: yaml.Node) -> Path:
        text = self.scalar(node)
        if not isinstance(text, str) or not text:
            raise self.error(node, f"'from' takes a checkpoint path, got {text!r}")
        path = Path(text).expanduser()
        if not path.is_absolute():
            path = self.path.parent / path
        if not path.exists():
            raise self.error(node, f"checkpoint '{text}' not found ({path})")
        return path

    def add(
        self, node: yaml.Node, where: Where, selection: Selection, values: dict[str, yaml.Node]
    ) -> AddEdit:
        if ("value" in values) == ("from" in values):
            raise self.error(node, "an add edit takes either 'value' or 'from', one of them")
        if "value" in values:
            if "tensor" in values:
                raise self.error(values["tensor"], "'tensor' names a tensor of 'from'; give 'from'")
            return AddEdit(where, selection, value=self.number(values["value"]))
        tensor = None
        if "tensor" in values:
            tensor = self.scalar(values["tensor"])
            if not isinstance(tensor, str) or not tensor:
                raise self.error(values["tensor"], f"'tensor' takes a name, got {tensor!r}")
        return AddEdit(
            where, selection, source=self.checkpoint(values["from"]), source_tensor=tensor
        )

    def prune(
        self, node: yaml.Node, where: Where, selection: Selection, values: dict[str, yaml.Node]
    ) -> PruneEdit:
        if selection.patterns:
            raise self.error(
                node, "a prune edit selects its tensors by 'layers', 'heads' and 'channels'"
            )
        given = [key for key in ("heads", "channels") if key in values]
        if len(given) == 2:
            raise self.error(node, "a prune edit takes 'heads' or 'channels', not both")
        if not given:
            if not selection.layers:
                raise self.error(node, "a prune edit needs 'layers', 'heads' or 'channels'")
            return PruneEdit(where, selection, PruneTarget.LAYERS)
        (key,) = given
        return PruneEdit(where, selection, PruneTarget(key), self.ranges(values[key], key))
