"""Multimodal RoPE positions (M-RoPE): a (temporal, height, width) position for each token.

A text token's three positions are equal and advance by one per token. An image's tokens
take their (t, h, w) index in the merged grid, offset by the position the next text token
would have had; text after the image continues from the image's largest position + 1. So
every token after an image sits `rope_delta` positions away from its index, where the delta
sums, over the images before it, max(t, h, w) of the merged grid minus the image's tokens.
Reference: transformers' `Qwen2VLModel.get_rope_index`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mlxcel_core.images import PromptImage, RowImages


def _merged_grid(image: PromptImage, merge_size: int) -> tuple[int, int, int]:
    t, h, w = image.inputs.grid_thw
    grid = (t, h // merge_size, w // merge_size)
    if grid[0] * grid[1] * grid[2] != image.num_tokens:
        raise ValueError(
            f"an image of {image.num_tokens} tokens at {image.start} cannot have the merged "
            f"grid {grid}"
        )
    return grid


def row_positions(row: RowImages, num_queries: int, merge_size: int) -> np.ndarray:
    """(3, num_queries) int32 positions of the tokens at indices offset .. offset + L - 1.

    Args:
        row: the row's cache offset and all of its images (`inputs.grid_thw` each), in
            prompt order.
        num_queries: L, the tokens in this pass.
        merge_size: the vision tower's spatial merge size.

    Raises:
        ValueError: an image's token count does not match its grid.
    """
    index = np.arange(row.offset, row.offset + num_queries)
    positions = np.broadcast_to(index, (3, num_queries)).astype(np.int32)
    shift = 0
    for image in row.images:
        t, h, w = _merged_grid(image, merge_size)
        inside = (index >= image.start) & (index < image.stop)
        local = index[inside] - image.start
        base = image.start + shift
        positions[0, inside] = base + local // (h * w)
        positions[1, inside] = base + local // w % h
        positions[2, inside] = base + local % w
        shift += max(t, h, w) - image.num_tokens
        after = index >= image.stop
        positions[:, after] = index[after] + shift
    return positions


def batch_positions(rows: Sequence[RowImages], num_queries: int, merge_size: int) -> np.ndarray:
    """(3, B, num_queries) int32 positions of a forward pass, one `RowImages` per row."""
    return np.stack([row_positions(row, num_queries, merge_size) for row in rows], axis=1)
