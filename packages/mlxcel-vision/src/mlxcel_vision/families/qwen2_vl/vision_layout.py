"""Where each patch of an image sits: its 2D rotary position and, in Qwen2.5-VL, its
attention window. Pure index arithmetic on the patch grid (numpy).

Patches come from the processor grouped by merge block: the merge_size x merge_size patches
of one merged token are consecutive, blocks in row-major order.
Reference: transformers' `vision_utils.get_vision_position_ids` and `get_vision_window_index`.
"""

from __future__ import annotations

import numpy as np


def patch_positions(grid_thw: tuple[int, int, int], merge_size: int) -> np.ndarray:
    """(t * h * w, 2) int (row, column) of each patch, in the processor's patch order."""
    t, h, w = grid_thw
    rows, columns = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    blocks = (h // merge_size, merge_size, w // merge_size, merge_size)
    rows = rows.reshape(blocks).transpose(0, 2, 1, 3).reshape(-1)
    columns = columns.reshape(blocks).transpose(0, 2, 1, 3).reshape(-1)
    return np.tile(np.stack([rows, columns], axis=-1), (t, 1))


def _window_grid(
    grid_thw: tuple[int, int, int], merge_size: int, window_size: int, patch_size: int
) -> np.ndarray:
    """(t, windows, side, side) merged-token indices of each window, -1 where the padded
    grid has no token. Windows are `window_size` pixels square, tiled from the top left."""
    t, h, w = grid_thw
    side = window_size // merge_size // patch_size
    rows, columns = h // merge_size, w // merge_size
    # Like the reference, a grid already a multiple of the window gets a whole empty window.
    padded_rows = rows + side - rows % side
    padded_columns = columns + side - columns % side
    index = np.full((t, padded_rows, padded_columns), -1, dtype=np.int64)
    index[:, :rows, :columns] = np.arange(t * rows * columns).reshape(t, rows, columns)
    windows = index.reshape(t, padded_rows // side, side, padded_columns // side, side)
    return windows.transpose(0, 1, 3, 2, 4).reshape(t, -1, side, side)


def window_order(
    grid_thw: tuple[int, int, int], merge_size: int, window_size: int, patch_size: int
) -> np.ndarray:
    """(t * h * w / merge_size^2,) the merged-token indices in window order: window by
    window, row-major inside each; the tower permutes its input by it and undoes it after
    the merger."""
    windows = _window_grid(grid_thw, merge_size, window_size, patch_size).reshape(-1)
    return windows[windows >= 0]


def window_ids(
    grid_thw: tuple[int, int, int], merge_size: int, window_size: int, patch_size: int
) -> np.ndarray:
    """(t * h * w / merge_size^2,) the window of each merged token, in window order."""
    windows = _window_grid(grid_thw, merge_size, window_size, patch_size)
    ids = np.broadcast_to(
        np.arange(windows.shape[0] * windows.shape[1]).reshape(windows.shape[:2])[..., None, None],
        windows.shape,
    ).reshape(-1)
    return ids[windows.reshape(-1) >= 0]
