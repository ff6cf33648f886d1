"""Device-level measurements for `gpu_targets.py`: the copy bandwidth that sets the HBM
roofline, and the cost of one forward pass through the engine's model runner.
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
import numpy as np

from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.engine.runner import ModelRunner, RowInput
from mlxcel_core.language_model import LanguageModel

BLOCK_SIZE = 16
WARMUP_PASSES = 3


def copy_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes per second a device-to-device copy moves, counting bytes read plus bytes
    written (as KINDS.md's figures do): the median over `repeats` of `x + 1` over
    `nbytes` of float32."""
    x = mx.random.uniform(shape=(nbytes // 4,))
    mx.eval(x)
    mx.eval(x + 1)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(x + 1)
        seconds.append(time.perf_counter() - start)
    return 2 * (nbytes // 4) * 4 / statistics.median(seconds)


def pass_seconds(
    model: LanguageModel, *, tokens_per_row: int, context: int, passes: int, seed: int = 0
) -> float:
    """Median wall seconds of one forward pass of `tokens_per_row` tokens of one row after
    `context` cached positions, as the engine's `ModelRunner` runs it over a paged KV cache
    (graph building, launch and the wait for the device; no sampling). Each pass appends
    its tokens, so the key count grows as in decoding, and every pass after the first
    `WARMUP_PASSES` is timed. `tokens_per_row` > 1 asks for every position's logits, as a
    speculative verification does.
    """
    capacity = context + (WARMUP_PASSES + passes) * tokens_per_row
    num_blocks = -(-capacity // BLOCK_SIZE) + 1
    profile = profile_model(model, BLOCK_SIZE)
    storage = PagedKVStorage(profile.layers, BLOCK_SIZE, num_blocks)
    storage.ensure_capacity(num_blocks)
    runner = ModelRunner(model, storage)
    tokens = np.random.default_rng(seed).integers(1, profile.vocab_size, capacity).tolist()

    def run(offset: int, count: int, num_logits: int) -> float:
        table = list(range(1, 1 + -(-(offset + count) // BLOCK_SIZE)))
        row = RowInput(tokens[offset : offset + count], (table,), offset, num_logits=num_logits)
        start = time.perf_counter()
        mx.eval(runner.execute([row]), storage.arrays())
        return time.perf_counter() - start

    run(0, context, 1)
    seconds = []
    for index in range(WARMUP_PASSES + passes):
        elapsed = run(context + index * tokens_per_row, tokens_per_row, tokens_per_row)
        if index >= WARMUP_PASSES:
            seconds.append(elapsed)
    return statistics.median(seconds)
