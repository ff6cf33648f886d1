"""4-bit products of a few and many rows with one weight: mlxcel's quantized matvec kernel
against MLX's `quantized_matmul`, dequantizing then multiplying, and the bf16 product.

The weights are the Llama-3.1-8B layers' shapes, 4-bit with group size 64 (as
`random_model.py --bits 4` writes them), bf16 activations. Each figure is the median over
`--repeats` groups of `--calls` calls evaluated together, per call, cycling through
`COPIES` copies of the weight so that no call finds it in L2. Building a call's graph is
timed apart ("host µs", the median over `--repeats` groups of building `--calls` graphs
that are not evaluated): the group's evaluation follows its building, so the device's
share of a call is the difference. "GB/s" is the bytes of the weight as the tactic stores
it (packed levels, scales and biases; bf16 for the bf16 product) over that device share.
The kernel runs with 2, 4 and 8 outputs per block and with 32, 64 or 128 threads a block
(the threads walk a weight row's 16-byte chunks that many apart). The kernel's largest
error against the exact product of the dequantized weight, relative to the largest
output, is printed once per shape.

    python benchmarks/quantized_matmul.py --rows 1,2,4,8,16,32,64
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import mlx.core as mx
from paged_attention import time_call

from mlxcel_core.kernels import CUDA
from mlxcel_core.kernels.quantized_matvec import MAX_ROWS, quantized_matvec_kernel

# (outputs, inputs) of the 8B shape's gate/up, down, q/o and k/v projections.
SHAPES = {
    "gate/up": (14336, 4096),
    "down": (4096, 14336),
    "q/o": (4096, 4096),
    "k/v": (1024, 4096),
}
COPIES = 4
GROUP_SIZE = 64
BITS = 4


def cycling(functions: Sequence[Callable[[], mx.array]]) -> Callable[[], mx.array]:
    """One call of each function in turn."""
    state = {"next": 0}

    def call() -> mx.array:
        function = functions[state["next"] % len(functions)]
        state["next"] += 1
        return function()

    return call


Tactic = tuple[list[Callable[[], mx.array]], int]


def tactics_for(x: mx.array, dense: list[mx.array], quantized: list[tuple]) -> dict[str, Tactic]:
    """Each tactic's calls (one per weight copy) and the weight bytes it reads."""

    def quantized_matmul(q):
        return mx.quantized_matmul(x, *q, transpose=True, group_size=GROUP_SIZE, bits=BITS)

    def dequantized(q):
        return x @ mx.dequantize(*q, group_size=GROUP_SIZE, bits=BITS).astype(x.dtype).T

    def kernel(q, per_block, threads):
        return quantized_matvec_kernel(
            x,
            *q,
            group_size=GROUP_SIZE,
            bits=BITS,
            backend=CUDA,
            rows_per_block=per_block,
            threads=threads,
        )

    quantized_bytes = sum(a.nbytes for a in quantized[0])
    tactics = {
        "bf16 matmul": ([lambda w=w: x @ w.T for w in dense], dense[0].nbytes),
        "quantized_matmul": ([lambda q=q: quantized_matmul(q) for q in quantized], quantized_bytes),
        "dequantize, then matmul": (
            [lambda q=q: dequantized(q) for q in quantized],
            quantized_bytes,
        ),
    }
    if x.shape[0] <= MAX_ROWS:
        for per_block in (2, 4, 8):
            for threads in (32, 64, 128):
                tactics[f"kernel, {per_block} outputs, {threads} threads a block"] = (
                    [lambda q=q, r=per_block, t=threads: kernel(q, r, t) for q in quantized],
                    quantized_bytes,
                )
    return tactics


def kernel_error(x: mx.array, quantized: tuple) -> float:
    """Largest |kernel - exact| over the largest |exact|, the exact product in float32."""
    weight, scales, biases = quantized
    exact = x.astype(mx.float32) @ mx.dequantize(
        weight, scales.astype(mx.float32), biases.astype(mx.float32),
        group_size=GROUP_SIZE, bits=BITS,
    ).T  # fmt: skip
    out = quantized_matvec_kernel(x, *quantized, group_size=GROUP_SIZE, bits=BITS, backend=CUDA)
    return (mx.abs(out - exact).max() / mx.abs(exact).max()).item()


def build_seconds(function: Callable[[], mx.array], calls: int, repeats: int) -> float:
    """Median seconds per call of building `function`'s graph, never evaluated."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def time_shape(name: str, rows: Sequence[int], calls: int, repeats: int) -> list[str]:
    N, K = SHAPES[name]
    dense = [
        mx.random.normal((N, K), key=mx.random.key(i)).astype(mx.bfloat16) for i in range(COPIES)
    ]
    quantized = [mx.quantize(w, group_size=GROUP_SIZE, bits=BITS) for w in dense]
    mx.eval(dense, quantized)
    lines = []
    for M in rows:
        x = mx.random.normal((M, K)).astype(mx.bfloat16)
        if M <= MAX_ROWS:
            error = kernel_error(x, quantized[0])
            lines.append(f"| {name} ({N}x{K}) | {M} | kernel error vs exact | {error:.2e} | | |")
        for tactic, (functions, nbytes) in tactics_for(x, dense, quantized).items():
            seconds = time_call(cycling(functions), calls, repeats)
            host = build_seconds(cycling(functions), calls, repeats)
            device = max(seconds - host, 1e-9)
            lines.append(
                f"| {name} ({N}x{K}) | {M} | {tactic} | {seconds * 1e6:,.1f} | "
                f"{host * 1e6:,.1f} | {nbytes / device / 1e9:,.0f} |"
            )
            print(lines[-1], flush=True)
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    print(mx.default_device(), mx.device_info().get("device_name", ""), flush=True)
    lines = []
    for name in args.shapes.split(","):
        lines += time_shape(name, rows, args.calls, args.repeats)
    print("| weight | rows | tactic | µs per call | host µs | GB/s of weight |")
    print("|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
