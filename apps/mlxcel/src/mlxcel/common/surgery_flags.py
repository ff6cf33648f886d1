"""`--surgery FILE` (`MLXCEL_SURGERY`): weight edits applied while the model loads, shared by
`generate`, `run`, `serve` and `bench`. They apply to the model `-m` names, not to a draft
model."""

from __future__ import annotations

import argparse

from mlxcel.common.flags import Flag, UsageError
from mlxcel_models.surgery import SurgeryPlan, read_surgery_file

SURGERY_FLAG = Flag(
    ("--surgery",),
    "surgery",
    str,
    None,
    "a YAML file of weight edits (scale, add, prune, replace, interpolate) applied to the "
    "model while it loads; see docs/surgery.md",
    env="MLXCEL_SURGERY",
)


def surgery_plan_from(args: argparse.Namespace) -> SurgeryPlan | None:
    """The validated surgery file `--surgery` names, read before anything loads; None
    without one.

    Raises:
        UsageError: the path is empty.
        SurgeryError: the file cannot be read or is invalid (its message names the line).
    """
    if args.surgery is None:
        return None
    if not args.surgery.strip():
        raise UsageError("--surgery/MLXCEL_SURGERY: the path of the surgery file is empty")
    return read_surgery_file(args.surgery)
