"""The hook for LoRA adapters: per-request scales, applied per row of a batch.

Core knows nothing of adapters' weights. The engine resolves each request's scales once,
when the request arrives, tells the model's adapters every row's scales before each forward
pass, and salts the request's prefix-cache block hashes with them, so that no KV computed
under one adapter setting is reused under another. Single-sequence generation sets the
global scales once before it starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

AdapterScales = tuple[float, ...]
"""One scale per loaded adapter, in load order; 0.0 turns an adapter off."""


class RowAdapterScales(Protocol):
    """A model's unfused adapters, whose scales may differ between the rows of a batch."""

    def resolve_scales(self, requested: AdapterScales | None) -> AdapterScales:
        """The scales a request runs with: its own, or the current global ones for None."""
        ...

    def set_row_scales(self, rows: Sequence[AdapterScales]) -> None:
        """Set the scales of each row (in batch order) of the next forward pass.

        Args:
            rows: one entry per row of the (B, L) token batch, each as `resolve_scales`
                returned it.
        """
        ...


def adapter_cache_salt(scales: AdapterScales | None) -> tuple[str, ...]:
    """The prefix-cache key of a request's adapter scales; empty when no adapters are loaded.

    Scales are written exactly (`float.hex`), so only identical settings share KV blocks.
    """
    if scales is None:
        return ()
    return ("lora", *(float(scale).hex() for scale in scales))
