"""The model runner: one step's forward passes over the paged KV cache.

It makes no decisions: it is told which tokens of which sequences to compute and returns
the logits the engine samples from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.adapters import AdapterScales, RowAdapterScales
from mlxcel_core.cache.paged import BatchRow, PagedBatch, PagedKVStorage, make_layer_caches
from mlxcel_core.generate import LanguageModel


@dataclass(frozen=True)
class RowInput:
    """One sequence's tokens for this step.

    Attributes:
        token_ids: the tokens to compute, at positions `offset` on (at least one).
        block_table: the sequence's blocks, covering `offset + len(token_ids)` positions.
        offset: positions already in the cache.
        adapter_scales: the sequence's LoRA adapter scales; None without unfused adapters.
    """

    token_ids: Sequence[int]
    block_table: Sequence[int]
    offset: int
    adapter_scales: AdapterScales | None = None


class ModelRunner:
    """Runs a language model over paged KV.

    Single-token rows (decode, and recompute tails) run as one batched forward pass; each
    longer row (a prefill chunk) runs alone, so no row is padded to another's length.

    Args:
        model: the language model; its attention layers call the cache protocol.
        storage: the key/value pools the model reads and writes.
        adapters: the model's unfused LoRA adapters, told each forward pass's row scales.
    """

    def __init__(
        self,
        model: LanguageModel,
        storage: PagedKVStorage,
        *,
        adapters: RowAdapterScales | None = None,
    ) -> None:
        self.model = model
        self.storage = storage
        self.adapters = adapters

    def execute(self, rows: Sequence[RowInput]) -> list[mx.array]:
        """Compute every row's tokens, storing their KV.

        Returns:
            Per row, in order, the (V,) logits after its last token; lazy, like the pools'
            writes, until the caller evaluates them with `storage.arrays()`.
        """
        logits: list[mx.array | None] = [None] * len(rows)
        single = [i for i, row in enumerate(rows) if len(row.token_ids) == 1]
        if single:
            tokens = mx.array([[rows[i].token_ids[0]] for i in single], dtype=mx.int32)
            out = self._forward(tokens, [rows[i] for i in single])
            for position, i in enumerate(single):
                logits[i] = out[position]
        for i, row in enumerate(rows):
            if logits[i] is None:
                tokens = mx.array([list(row.token_ids)], dtype=mx.int32)
                logits[i] = self._forward(tokens, [row])[0]
        return [row_logits for row_logits in logits if row_logits is not None]

    def _forward(self, tokens: mx.array, rows: Sequence[RowInput]) -> mx.array:
        """(B, L) tokens → (B, V) logits of each row's last position."""
        batch = PagedBatch(
            [BatchRow(row.block_table, row.offset, len(row.token_ids)) for row in rows],
            self.storage.block_size,
        )
        caches = make_layer_caches(self.storage, batch)
        if self.adapters is not None:
            self.adapters.set_row_scales([row.adapter_scales or () for row in rows])
        return self.model(tokens, caches, last_only=True)[:, -1]
