"""Shape-bucketed tactic search: time candidates, keep a winner only when it clearly beats
the default, and make the entry `mlxcel tune` stores.

What is found is stored and read back through `mlxcel_core.tuning`, below the kernels;
this package, which times the engine's prefill (`prefill`) and the paged decode kernel's
split count (`paged_decode`), sits above the engine. The measurements are imported by
whoever tunes, not here.
"""

from mlxcel_core.autotune.decision import Verdict, choose
from mlxcel_core.autotune.harness import Measurement, measure_interleaved
from mlxcel_core.autotune.search import SearchResult, search

__all__ = [
    "Measurement",
    "SearchResult",
    "Verdict",
    "choose",
    "measure_interleaved",
    "search",
]
