"""Decode passes over rows of mixed context lengths: attention by length groups against
attention over the whole padded batch, where no decode kernel reads the pools (the CPU).

For each case, one decode pass of the embedded SmolLM2 (float32) through `ModelRunner` over
paged storage, one row per context length, rows' KV left as the pools were allocated (the
cost does not depend on the values). The two ways alternate within each round, so load on
a shared machine falls on both alike; the figure is the median of `--rounds` passes each.
"Padded" is the way before length groups, restored for the comparison by making
`PagedBatch.length_groups` find none.

    python benchmarks/decode_length_groups.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import mlx.core as mx

from mlxcel_core.cache.paged import PagedBatch, PagedKVStorage
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.engine.runner import ModelRunner, RowInput
from mlxcel_models.default_model import default_model_path
from mlxcel_models.loading.loader import load_model

BLOCK_SIZE = 16
CASES = (
    (61, 1300),
    (100,) * 7 + (2000,),
    (300, 600, 1200, 2400),
    (500, 520, 540, 560),
    (20,) * 7 + (100,),
    (40, 90, 200, 400),
)


def decode_rows(lengths: Sequence[int]) -> list[RowInput]:
    """One decode row per context length, with blocks of its own after block 0."""
    rows, next_block = [], 1
    for length in lengths:
        num_blocks = length // BLOCK_SIZE + 1
        blocks = list(range(next_block, next_block + num_blocks))
        rows.append(RowInput([5], (blocks,), length, 1, None, ()))
        next_block += num_blocks
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = load_model(default_model_path()).model
    num_blocks = 1 + max(sum(length // BLOCK_SIZE + 1 for length in case) for case in CASES)
    storage = PagedKVStorage(profile_model(model, 8).layers, BLOCK_SIZE, num_blocks)
    storage.ensure_capacity(num_blocks)
    runner = ModelRunner(model, storage)
    grouped = PagedBatch.length_groups

    def padded(batch: PagedBatch) -> None:
        return None

    print("| context lengths | by length groups (ms) | padded (ms) | padded / grouped |")
    print("|---|---:|---:|---:|")
    for lengths in CASES:
        rows = decode_rows(lengths)
        times: dict[str, list[float]] = {"grouped": [], "padded": []}
        for round_ in range(args.rounds + 1):
            for name, way in (("grouped", grouped), ("padded", padded)):
                PagedBatch.length_groups = way
                start = time.perf_counter()
                mx.eval(runner.execute(rows), storage.arrays())
                if round_:  # the first round warms both up
                    times[name].append(time.perf_counter() - start)
        PagedBatch.length_groups = grouped
        by_groups, by_padding = (statistics.median(times[name]) * 1000 for name in times)
        shown = ", ".join(map(str, lengths))
        print(f"| {shown} | {by_groups:.1f} | {by_padding:.1f} | {by_padding / by_groups:.2f}x |")


if __name__ == "__main__":
    main()
