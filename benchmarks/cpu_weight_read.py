"""How fast MLX's CPU matrix-vector product reads float32 weights, against a plain copy.

Decode at batch 1 reads every weight once per token, so on the CPU its speed is bounded by
the rate these products read their matrices. Prints GB/s for a NumPy copy (read plus
written), one product over a matrix of `--weight-mb`, and `--layers` products of the
`--shape` matrices, best of `--repeats`.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python benchmarks/cpu_weight_read.py --shape 576x1536 --layers 150
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np


def best_seconds(call: Callable[[], object], repeats: int) -> float:
    """The shortest of `repeats` timed calls, after one untimed call."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weight-mb", type=int, default=540)
    parser.add_argument("--shape", default="576x1536", help="ROWSxCOLS of each small matrix")
    parser.add_argument("--layers", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    mx.set_default_device(mx.cpu)

    source = np.ones(args.weight_mb * 10**6 // 4, np.float32)
    target = np.empty_like(source)
    copy = best_seconds(lambda: np.copyto(target, source), args.repeats)
    print(f"NumPy copy: {2 * source.nbytes / copy / 1e9:.1f} GB/s (read plus written)")

    rows, cols = (int(n) for n in args.shape.split("x"))
    vector = mx.random.normal((1, rows))
    big = mx.random.normal((rows, source.nbytes // 4 // rows))
    mx.eval(vector, big)
    seconds = best_seconds(lambda: mx.eval(vector @ big), args.repeats)
    print(f"one product over {big.nbytes / 1e6:.0f} MB: {big.nbytes / seconds / 1e9:.1f} GB/s")

    small = [mx.random.normal((rows, cols)) for _ in range(args.layers)]
    mx.eval(small)
    seconds = best_seconds(lambda: mx.eval([vector @ w for w in small]), args.repeats)
    nbytes = sum(w.nbytes for w in small)
    print(f"{args.layers} products over {rows} x {cols}: {nbytes / seconds / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
