"""Tuned values where they are used: the tactics' shape buckets, the store `mlxcel tune`
writes them to (one file per device and MLX version), and the lookup the kernels and
commands read them through, inert unless `MLXCEL_AUTOTUNE` is set.

This is the lowest layer of mlxcel-core: the kernels read their tuned values from it, and
it imports nothing else of the package. The searches that measure the values, above the
engine, are `mlxcel_core.autotune`.
"""

from mlxcel_core.tuning.buckets import (
    PAGED_DECODE_PARTITIONS,
    PREFILL_CHUNK,
    TACTICS,
    next_power_of_two,
    paged_decode_bucket,
    prefill_bucket,
)
from mlxcel_core.tuning.lookup import (
    AUTOTUNE_VARIABLE,
    Tunings,
    autotune_enabled,
    install_tunings,
    installed_tunings,
)
from mlxcel_core.tuning.store import (
    TunedEntry,
    TuningScope,
    TuningStore,
    autotune_dir,
)

__all__ = [
    "AUTOTUNE_VARIABLE",
    "PAGED_DECODE_PARTITIONS",
    "PREFILL_CHUNK",
    "TACTICS",
    "TunedEntry",
    "TuningScope",
    "TuningStore",
    "Tunings",
    "autotune_dir",
    "autotune_enabled",
    "install_tunings",
    "installed_tunings",
    "next_power_of_two",
    "paged_decode_bucket",
    "prefill_bucket",
]
