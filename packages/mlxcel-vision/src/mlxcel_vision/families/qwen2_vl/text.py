"""Qwen2-VL's language model: mlx-lm's qwen2 layers with multimodal RoPE in place of 1D RoPE."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxcel_core.cache import KVCache
from mlxcel_core.images import RowImages
from mlxcel_vision.families.qwen2_vl.positions import batch_positions
from mlxcel_vision.text_decoder import MlxLmTextDecoder


class MultimodalRoPE(nn.Module):
    """Rotary embedding whose frequencies turn with the temporal, height or width position.

    The i-th frequency pair follows position axis k where i falls in the k-th part of
    `mrope_section` (non-interleaved halves, as Qwen2's RoPE). One instance serves every
    layer; the decoder sets a pass's positions before the layers run, since mlx-lm's
    attention passes the rotary embedding only the cache offset. Without positions it is
    plain 1D RoPE from the offset, as for text; passes whose rows are all text-like (every
    decode step) run MLX's fused RoPE from each row's shifted start, and only passes
    covering image tokens build cos/sin tables.

    Args:
        dims: head dimension.
        base: RoPE base (rope_theta).
        mrope_section: frequency pairs per axis; they sum to dims / 2.
    """

    def __init__(self, dims: int, base: float, mrope_section: tuple[int, int, int]) -> None:
        super().__init__()
        self.dims = dims
        self.base = base
        self._inv_freq = mx.array(1.0 / base ** (np.arange(0, dims, 2, dtype=np.float32) / dims))
        self._axis_of_frequency = np.repeat(np.arange(3), mrope_section)
        self._tables: tuple[mx.array, mx.array] | None = None
        self._row_starts: mx.array | None = None

    def set_positions(self, positions: np.ndarray | None) -> None:
        """Rotate by `positions` (3, B, L) from now on, or by the cache offset if None."""
        self._tables = self._row_starts = None
        if positions is None:
            return
        starts = positions[0, :, :1]
        if (positions == starts + np.arange(positions.shape[2])).all():
            # Text-like rows (decode steps, chunks without image tokens): three equal,
            # consecutive positions are 1D RoPE from each row's start, one fused kernel.
            self._row_starts = mx.array(starts[:, 0])
            return
        # For each frequency, the position along its axis: (B, L, dims / 2).
        chosen = positions[self._axis_of_frequency].transpose(1, 2, 0)
        angles = mx.array(chosen.astype(np.float32)) * self._inv_freq
        angles = mx.concatenate([angles, angles], axis=-1)[:, None]
        self._tables = (mx.cos(angles), mx.sin(angles))

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        if self._tables is not None:
            cos, sin = self._tables
            half = self.dims // 2
            rotated = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
            return (x * cos + rotated * sin).astype(x.dtype)
        start = offset if self._row_starts is None else self._row_starts
        return mx.fast.rope(
            x, self.dims, traditional=False, base=self.base, scale=1.0, offset=start
        )


class Qwen2VLTextDecoder(MlxLmTextDecoder):
    """The `TextDecoder` of Qwen2-VL and Qwen2.5-VL: mlx-lm's decoder with its attention
    layers' RoPE replaced by one `MultimodalRoPE`, given each pass's positions.

    Args:
        module: mlx-lm's qwen2 `Model`.
        rope: the multimodal RoPE its layers now share.
        merge_size: the vision tower's spatial merge size (image tokens per grid side).
    """

    def __init__(self, module: nn.Module, rope: MultimodalRoPE, merge_size: int) -> None:
        super().__init__(module)
        self._rope = rope
        self._merge_size = merge_size
        for layer in module.layers:
            layer.self_attn.rope = rope

    def __call__(
        self,
        embeddings: mx.array,
        cache: Sequence[KVCache],
        *,
        images: Sequence[RowImages] | None = None,
        last_only: bool = False,
    ) -> mx.array:
        """Run the layers on (B, L, hidden) embeddings.

        Args:
            images: one `RowImages` per row, whose offsets and images give the rows'
                multimodal positions; None rotates every row from its cache offset.

        Returns:
            Logits (B, L, V), or (B, 1, V) with `last_only`.

        Raises:
            ValueError: an image's token count does not match its grid.
        """
        positions = None
        if images is not None:
            positions = batch_positions(images, embeddings.shape[1], self._merge_size)
        self._rope.set_positions(positions)
        try:
            return super().__call__(embeddings, cache, images=images, last_only=last_only)
        finally:
            self._rope.set_positions(None)
