"""Shape-bucketed tactic search: time candidates, keep a winner only when it clearly beats
the default, persist it per device and MLX version, read it back where the tactic runs.

Inert unless `MLXCEL_AUTOTUNE` is set (see `lookup`). The measurements themselves are in
`prefill` (the engine's prefill chunk) and `paged_decode` (the CUDA paged decode kernel's
split count), imported by whoever tunes, not here: the kernels read their tuned values
from this package.
"""

from mlxcel_core.autotune.buckets import (
    PAGED_DECODE_PARTITIONS,
    PREFILL_CHUNK,
    TACTICS,
    paged_decode_bucket,
    prefill_bucket,
)
from mlxcel_core.autotune.decision import Verdict, choose
from mlxcel_core.autotune.harness import Measurement, measure_interleaved
from mlxcel_core.autotune.lookup import (
    AUTOTUNE_VARIABLE,
    Tunings,
    autotune_enabled,
    install_tunings,
    installed_tunings,
)
from mlxcel_core.autotune.search import SearchResult, search
from mlxcel_core.autotune.store import (
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
    "Measurement",
    "SearchResult",
    "TunedEntry",
    "TuningScope",
    "TuningStore",
    "Tunings",
    "Verdict",
    "autotune_dir",
    "autotune_enabled",
    "choose",
    "install_tunings",
    "installed_tunings",
    "measure_interleaved",
    "paged_decode_bucket",
    "prefill_bucket",
    "search",
]
