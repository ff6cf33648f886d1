"""LoRA adapter flags, shared by `generate` and `serve`: llama-server's names plus a fuse switch.

Adapter ids follow the command line: every `--lora` in order, then every `--lora-scaled`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

from mlxcel.common.flags import Flag, UsageError
from mlxcel_core.errors import InputError
from mlxcel_models.lora import AdapterSpec


def _scaled_adapter(values: Sequence[str]) -> tuple[str, float]:
    path, scale_text = values
    scale = float(scale_text)
    if not math.isfinite(scale):
        raise ValueError(f"the scale must be a finite number, got {scale_text!r}")
    return path, scale


ADAPTER_FLAGS = (
    Flag(("--lora",), "lora", str, None,
         "a LoRA adapter folder (mlx-lm or PEFT), at scale 1 (repeatable)", repeatable=True),
    Flag(("--lora-scaled",), "lora_scaled", _scaled_adapter, None,
         "a LoRA adapter folder and its scale (repeatable)", repeatable=True,
         metavar=("PATH", "SCALE")),
    Flag(("--lora-init-without-apply",), "lora_init_without_apply", bool, False,
         "load the adapters at scale 0 (set scales later with POST /lora-adapters)",
         is_switch=True),
    Flag(("--lora-fuse",), "lora_fuse", bool, False,
         "add the scaled adapters into the weights: no per-token cost, scales fixed",
         is_switch=True),
)  # fmt: skip


def adapter_specs_from(args: argparse.Namespace) -> tuple[AdapterSpec, ...]:
    """The adapters to load, in id order, with their starting scales.

    Raises:
        UsageError: `--lora-fuse` without adapters, or with `--lora-init-without-apply`.
        InputError: an adapter folder does not exist.
    """
    given = [(path, 1.0) for path in args.lora or ()] + list(args.lora_scaled or ())
    for flag, name in (
        ("--lora-fuse", "lora_fuse"),
        ("--lora-init-without-apply", "lora_init_without_apply"),
    ):
        if getattr(args, name) and not given:
            raise UsageError(f"{flag} needs adapters: give --lora or --lora-scaled")
    if args.lora_fuse and args.lora_init_without_apply:
        raise UsageError("--lora-fuse with --lora-init-without-apply would fuse nothing")
    for path, _ in given:
        if not Path(path).is_dir():
            raise InputError(f"LoRA adapter {path}: no such folder")
    return tuple(
        AdapterSpec(path, 0.0 if args.lora_init_without_apply else scale) for path, scale in given
    )
