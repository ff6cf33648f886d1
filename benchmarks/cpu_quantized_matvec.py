"""Decode products of quantized weights on the CPU: mlxcel's C kernel against MLX's
`quantized_matmul`, at the default model's shapes.

SmolLM2-135M's weights (576 wide, 1536 in the MLP, a 49152-row tied output projection),
float32 activations and scales as the CPU path holds them; MLX's product on one core, the
kernel on the threads `threads_for` gives it on two cores (the output projection on two). Each
figure is the median over `--repeats` groups of `--calls` calls, per call, the MLX
product evaluated call by call as a decode step does, in milliseconds and nanoseconds per
weight and row.

    python benchmarks/cpu_quantized_matvec.py --rows 1,2,4,8
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable, Sequence

import mlx.core as mx

from mlxcel_core.kernels.cpu_matvec import (
    available,
    cpu_quantized_matvec,
    describe_cpu_kernels,
    threads_for,
)

# (outputs, inputs, bits, group size): the MLP's gate/up and down, q/o, k/v, the output.
SHAPES = (
    (1536, 576, 4, 32),
    (576, 1536, 4, 32),
    (576, 576, 4, 32),
    (192, 576, 4, 32),
    (49152, 576, 8, 32),
    (49152, 576, 4, 32),
)


def per_call(function: Callable[[], mx.array], calls: int, repeats: int) -> float:
    """Median seconds of one evaluated call."""
    for _ in range(3):
        mx.eval(function())
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            mx.eval(function())
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def time_shape(
    N: int, K: int, bits: int, group: int, *, rows: Sequence[int], calls: int, repeats: int
) -> list[str]:
    """The table's lines for one weight shape, one per row count."""
    w = mx.random.normal((N, K), key=mx.random.key(N + K))
    packed, scales, biases = mx.quantize(w, group_size=group, bits=bits)
    mx.eval(packed, scales, biases)
    lines = []
    for count in rows:
        x = mx.random.normal((count, K), key=mx.random.key(count))
        mx.eval(x)
        theirs = per_call(
            functools.partial(
                mx.quantized_matmul, x, packed, scales, biases,
                transpose=True, group_size=group, bits=bits,
            ),
            calls,
            repeats,
        )  # fmt: skip
        threads = threads_for(count, N, K, cpu_streams=2)
        ours = per_call(
            functools.partial(
                cpu_quantized_matvec,
                x,
                packed,
                scales,
                biases,
                group_size=group,
                bits=bits,
                threads=threads,
            ),
            calls,
            repeats,
        )
        weights = N * K * count
        lines.append(
            f"| {N}x{K} | {bits} | {count} | {theirs * 1e3:.3f} | {ours * 1e3:.3f} | "
            f"{theirs / weights * 1e9:.3f} | {ours / weights * 1e9:.3f} | {theirs / ours:.1f}x |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    mx.set_default_device(mx.cpu)
    print(f"kernel: {describe_cpu_kernels()}")
    if not available():
        raise SystemExit("the CPU kernel is not available here")
    print("| weight | bits | rows | MLX ms | kernel ms | MLX ns/w | kernel ns/w | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for line in time_shape(*shape, rows=[int(r) for r in args.rows.split(",")],
                               calls=args.calls, repeats=args.repeats):  # fmt: skip
            print(line, flush=True)


if __name__ == "__main__":
    main()
