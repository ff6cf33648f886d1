"""One decode step of one attention layer over TurboQuant KV pools, part by part.

Rows of `--context` positions are written into `PagedKVStorage` pools by one prefill pass
(keys centered past the first block, as the engine stores them), then one layer of a decode
step is timed as the model's attention runs it (`PagedLayerCache.update_and_fetch`, then
`attention`), and its write alone:
- write, kernel: store each row's new key and value, then attend by the decode kernel,
  `turbo_decode_attention_kernel` reading the codes as stored;
- write, gather then attend: the same, decoding every row's keys and values
  (`PagedKVStorage.gather`), then `mx.fast.scaled_dot_product_attention`, the path
  without the kernel;
- write: encoding and storing each row's new key and value;
- the same three over pools that keep the model's bf16 (the float decode kernel).
Each is the median of `--repeats` groups of `--calls` calls evaluated together, per call:
"total" from building the group's graphs to their results, "build" the Python that builds
them, "launch" MLX's encoding and launching of their operations (`mx.async_eval`, on the
calling thread). Where build + launch is most of the total, the host bounds the part; the
device's share is at least total - build - launch.

    python benchmarks/turbo_decode.py --context 8192 --batch 1,32 --cache-type turbo4
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from paged_attention import BLOCK_SIZE, SHAPES

from mlxcel_core.cache.paged import BatchRow, LayerGeometry, PagedBatch, PagedKVStorage
from mlxcel_core.cache.paged.layer_cache import PagedLayerCache


@dataclass(frozen=True)
class PartTimes:
    """Medians, seconds per call: the whole, building the graph, launching its operations."""

    total: float
    build: float
    launch: float


def time_parts(function: Callable[[], object], calls: int, repeats: int) -> PartTimes:
    """`function`'s time per call, and the host's share of it (see the module docstring)."""
    for _ in range(3):
        mx.eval([function() for _ in range(calls)])
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = [function() for _ in range(calls)]
        built = time.perf_counter()
        mx.async_eval(outputs)
        launched = time.perf_counter()
        mx.eval(outputs)
        samples.append((time.perf_counter() - start, built - start, launched - built))
    return PartTimes(*(statistics.median(column) / calls for column in zip(*samples, strict=True)))


def written_storage(
    batch: int, context: int, shape: tuple[int, int, int], cache_type: str
) -> tuple[PagedKVStorage, list[list[int]]]:
    """Pools holding `batch` rows of `context - 1` positions, in shuffled blocks."""
    _, num_kv_heads, head_dim = shape
    per_row = -(-context // BLOCK_SIZE)
    rng = np.random.default_rng(context + batch)
    ids = rng.permutation(np.arange(1, 1 + batch * per_row)).tolist()
    tables = [ids[row * per_row : (row + 1) * per_row] for row in range(batch)]
    storage = PagedKVStorage(
        [LayerGeometry(num_kv_heads, head_dim, head_dim, mx.bfloat16)],
        BLOCK_SIZE,
        max_blocks=1 + len(ids),
        cache_type_k=cache_type,
        cache_type_v=cache_type,
    )
    storage.ensure_capacity(1 + len(ids))
    for row, table in enumerate(tables):
        prefill = PagedBatch([BatchRow(table, 0, context - 1)], BLOCK_SIZE)
        new = (context - 1, num_kv_heads, head_dim)
        keys = mx.random.normal(new, key=mx.random.key(2 * row)).astype(mx.bfloat16)
        values = mx.random.normal(new, key=mx.random.key(2 * row + 1)).astype(mx.bfloat16)
        storage.write(0, prefill.write_slots, keys, values, prefill.anchors)
        mx.eval(storage.arrays())
    return storage, tables


def time_step(
    shape_name: str, batch: int, context: int, cache_type: str, calls: int, repeats: int
) -> dict[str, PartTimes]:
    shape = SHAPES[shape_name]
    num_q_heads, num_kv_heads, head_dim = shape
    queries = mx.random.normal((batch, num_q_heads, 1, head_dim)).astype(mx.bfloat16)
    new = mx.random.normal((batch, num_kv_heads, 1, head_dim)).astype(mx.bfloat16)
    seconds = {}
    for name, kind in ((cache_type, cache_type), ("bf16", "auto")):
        storage, tables = written_storage(batch, context, shape, kind)
        step = PagedBatch([BatchRow(t, context - 1, 1) for t in tables], BLOCK_SIZE)
        mask = step.mask()

        def write_and_attend(storage=storage, step=step, mask=mask, kernel=True):
            """One layer of a decode pass, as the model's attention runs it."""
            storage.decode_kernel = kernel
            cache = PagedLayerCache(storage, 0, step)
            keys, values = cache.update_and_fetch(new, new)
            out = cache.attention(queries, keys, values, scale=head_dim**-0.5, mask=mask)
            return [out, *storage.arrays()]

        def write(storage=storage, step=step):
            rows = new.transpose(0, 2, 1, 3).reshape(batch, num_kv_heads, head_dim)
            storage.write(0, step.write_slots, rows, rows, step.anchors)
            return storage.arrays()

        seconds[f"{name} write, kernel"] = time_parts(write_and_attend, calls, repeats)
        seconds[f"{name} write, gather then attend"] = time_parts(
            lambda run=write_and_attend: run(kernel=False), calls, repeats
        )
        seconds[f"{name} write"] = time_parts(write, calls, repeats)
    return seconds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--batch", default="1,32")
    parser.add_argument("--cache-type", default="turbo4")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    print(mx.default_device(), "cuda" if mx.cuda.is_available() else "no cuda", flush=True)
    print("| shape | B | context | part | µs per layer | build µs | launch µs |")
    print("|---|---|---|---|---|---|---|")
    for batch in (int(b) for b in args.batch.split(",")):
        seconds = time_step(
            args.shape, batch, args.context, args.cache_type, args.calls, args.repeats
        )
        for name, part in seconds.items():
            print(
                f"| {args.shape} | {batch} | {args.context} | {name} | {part.total * 1e6:,.1f} "
                f"| {part.build * 1e6:,.1f} | {part.launch * 1e6:,.1f} |"
            )


if __name__ == "__main__":
    main()
