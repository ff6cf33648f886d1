"""What `mlxcel tune` stored, taken by the commands that run a model when `MLXCEL_AUTOTUNE`
is set (docs/autotune.md).

The stored values of this device and MLX version are installed for the kernels
(`mlxcel_core.tuning.install_tunings`), and a command whose prefill chunk flag came from
neither the command line nor its environment variable takes the chunk tuned for the
model's shape: `-ub` for `generate`, `run` and `serve`, `-b` (its prefill step) for
`bench`, and says so in one line on stderr. The shape is read from the model's headers
before it loads, so the memory check and the engine both see the chunk that will run.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import mlx.core as mx

from mlxcel.common.engine_flags import UBATCH_SIZE_FLAG
from mlxcel.common.flags import Flag
from mlxcel_core.tuning import (
    AUTOTUNE_VARIABLE,
    PREFILL_CHUNK,
    Tunings,
    install_tunings,
    prefill_bucket,
)
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.default_model import default_model_path
from mlxcel_models.memory import activation_dtype, estimate_weights, read_model_inventory
from mlxcel_models.store import resolve_model


def model_path(args: argparse.Namespace) -> Path:
    """The path of the model `-m` names (the default model without one), a Hugging Face
    id resolved through `args.model_store`, downloaded if the store does not hold it.

    Raises:
        ModelLoadError: the id cannot be fetched.
    """
    if args.model is None:
        return default_model_path()
    return resolve_model(args.model, args.model_store, revision=args.revision)


def prefill_bucket_for(path: Path) -> str:
    """The prefill chunk's shape bucket of the model at `path`, as it computes on the
    default device (its compute options applied): architecture, layers, hidden size,
    activation dtype, and "dense" or the bits of the quantized layers it keeps.

    Raises:
        ModelLoadError: the model is missing, corrupt or unsupported.
    """
    inventory = read_model_inventory(path)
    options = ComputeOptions.for_device(mx.default_device())
    bits = {tensor.bits for tensor in inventory.tensors if tensor.bits is not None}
    kept_quantized = bits and not estimate_weights(inventory, options).dense
    architecture = inventory.architecture
    return prefill_bucket(
        model_type=inventory.source.model_type,
        num_layers=architecture.num_layers,
        hidden_size=architecture.hidden_size,
        dtype=activation_dtype(inventory, options),
        weights="+".join(f"{b}bit" for b in sorted(bits)) if kept_quantized else "dense",
    )


def apply_autotune(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    err: TextIO,
    chunk_flag: Flag = UBATCH_SIZE_FLAG,
) -> None:
    """Install the tunings `environ` asks for (none without `MLXCEL_AUTOTUNE`), and set
    `chunk_flag`'s value in resolved `args` to the prefill chunk tuned for `-m`'s model
    when one is stored and neither the command line nor the flag's variable gave it,
    saying so on `err`.

    Raises:
        ModelLoadError: the model is missing, corrupt or unsupported.
    """
    tunings = Tunings.from_environ(environ)
    install_tunings(tunings)
    given = chunk_flag.dest in args.from_command_line or chunk_flag.env_name in environ
    if not tunings.enabled or given:
        return
    bucket = prefill_bucket_for(model_path(args))
    tuned = tunings.tuned(PREFILL_CHUNK, bucket)
    if tuned is not None:
        setattr(args, chunk_flag.dest, tuned)
        print(
            f"mlxcel: prefill chunk {tuned} from the autotune store ({AUTOTUNE_VARIABLE})",
            file=err,
        )
