"""The final draw of the sampler, three ways, on the default device:
- kernel: `gumbel_max_sample_kernel`, one fused launch (CUDA devices only; skipped elsewhere);
- reference: `gumbel_max_sample_reference`, the same draw in plain MLX operations;
- categorical: `mx.random.categorical` vmapped over per-row keys, as `sample_batch` draws.

Each is timed over (B, V) float32 logits, as the sampler chain leaves them, as the median
of `--repeats` interleaved rounds (`mlxcel_core.autotune.harness`), each round `--calls`
calls evaluated together; printed per call in µs, with categorical / kernel.

    PYTHONPATH=$(echo packages/*/src | tr ' ' :) python3 benchmarks/gumbel_sampling.py
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence

import mlx.core as mx

from mlxcel_core.autotune.harness import measure_interleaved
from mlxcel_core.kernels import kernel_backend
from mlxcel_core.kernels.gumbel_sampling import (
    gumbel_max_sample_kernel,
    gumbel_max_sample_reference,
)

Draw = Callable[[mx.array, mx.array, mx.array], mx.array]


def categorical_rows(logits: mx.array, temperatures: mx.array, seeds: mx.array) -> mx.array:
    tempered = logits / temperatures[:, None]
    draw = mx.vmap(lambda row, key: mx.random.categorical(row, key=key))
    return draw(tempered, seeds).astype(mx.int32)


def time_draws(
    draws: dict[str, Draw], num_rows: int, vocab_size: int, *, calls: int, repeats: int
) -> dict[str, float]:
    """Median seconds per call of each draw over fresh (num_rows, vocab_size) logits."""
    logits = mx.random.normal((num_rows, vocab_size), key=mx.random.key(num_rows))
    temperatures = mx.full((num_rows,), 0.8, dtype=mx.float32)
    seeds = [mx.random.split(mx.random.key(call), num_rows) for call in range(calls)]
    mx.eval(logits, temperatures, seeds)

    def run(name: str) -> None:
        mx.eval([draws[name](logits, temperatures, key) for key in seeds])

    measurements = measure_interleaved(list(draws), run, rounds=repeats)
    return {m.candidate: m.median / calls for m in measurements}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,8,64", help="rows per draw, comma-separated")
    parser.add_argument("--vocab", type=int, default=128256, help="tokens per row")
    parser.add_argument("--calls", type=int, default=20, help="calls evaluated per round")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds")
    args = parser.parse_args(argv)

    draws: dict[str, Draw] = {}
    backend = kernel_backend(mx.default_device())
    if backend is not None:
        draws["kernel"] = functools.partial(gumbel_max_sample_kernel, backend=backend)
    draws["reference"] = gumbel_max_sample_reference
    draws["categorical"] = categorical_rows

    print(f"device {mx.default_device()}, V = {args.vocab}, µs per call")
    print(f"{'B':>4} " + " ".join(f"{name:>12}" for name in draws) + f" {'cat/kernel':>11}")
    for num_rows in (int(b) for b in args.batch.split(",")):
        times = time_draws(draws, num_rows, args.vocab, calls=args.calls, repeats=args.repeats)
        row = " ".join(f"{times[name] * 1e6:12.1f}" for name in draws)
        ratio = f"{times['categorical'] / times['kernel']:11.2f}" if "kernel" in times else " " * 11
        print(f"{num_rows:>4} {row} {ratio}")


if __name__ == "__main__":
    main()
