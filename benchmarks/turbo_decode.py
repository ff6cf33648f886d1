"""One decode step of one attention layer over TurboQuant KV pools, part by part.

Rows of `--context` positions are written into `PagedKVStorage` pools by one prefill pass
(keys centered past the first block, as the engine stores them), then timed:
- turbo kernel: `turbo_decode_attention_kernel` reading the codes as stored;
- turbo gather then attend: decode every row's keys and values (`PagedKVStorage.gather`),
  then `mx.fast.scaled_dot_product_attention`, the path without the kernel;
- turbo write: encoding and storing each row's new key and value;
- bf16 kernel and bf16 write: the same over pools that keep the model's bf16.
Each is the median of `--repeats` groups of `--calls` calls evaluated together, per call.

    python benchmarks/turbo_decode.py --context 8192 --batch 1,32 --cache-type turbo4
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import mlx.core as mx
import numpy as np
from paged_attention import BLOCK_SIZE, SHAPES, time_call

from mlxcel_core.cache.paged import BatchRow, LayerGeometry, PagedBatch, PagedKVStorage
from mlxcel_core.cache.paged.batch import PagedLayerCache


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
) -> dict[str, float]:
    shape = SHAPES[shape_name]
    num_q_heads, num_kv_heads, head_dim = shape
    queries = mx.random.normal((batch, num_q_heads, 1, head_dim)).astype(mx.bfloat16)
    new = mx.random.normal((batch, num_kv_heads, 1, head_dim)).astype(mx.bfloat16)
    seconds = {}
    for name, kind in ((cache_type, cache_type), ("bf16", "auto")):
        storage, tables = written_storage(batch, context, shape, kind)
        step = PagedBatch([BatchRow(t, context - 1, 1) for t in tables], BLOCK_SIZE)
        cache = PagedLayerCache(storage, 0, step)
        mask = step.mask()

        def attend(cache=cache, storage=storage, step=step, mask=mask, kernel=True):
            storage.decode_kernel = kernel
            keys, values = storage.gather(0, step.read_slots, step.anchors)
            return cache.attention(queries, keys, values, scale=head_dim**-0.5, mask=mask)

        def write(storage=storage, step=step):
            storage.write(
                0,
                step.write_slots,
                new.transpose(0, 2, 1, 3).reshape(batch, num_kv_heads, head_dim),
                new.transpose(0, 2, 1, 3).reshape(batch, num_kv_heads, head_dim),
                step.anchors,
            )
            return storage.arrays()

        seconds[f"{name} kernel"] = time_call(attend, calls, repeats)
        seconds[f"{name} gather then attend"] = time_call(
            lambda attend=attend: attend(kernel=False), calls, repeats
        )
        seconds[f"{name} write"] = time_call(write, calls, repeats)
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
    print("| shape | B | context | part | µs per layer |")
    print("|---|---|---|---|---|")
    for batch in (int(b) for b in args.batch.split(",")):
        seconds = time_step(
            args.shape, batch, args.context, args.cache_type, args.calls, args.repeats
        )
        for name, s in seconds.items():
            print(f"| {args.shape} | {batch} | {args.context} | {name} | {s * 1e6:,.1f} |")


if __name__ == "__main__":
    main()
