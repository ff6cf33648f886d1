"""4-bit products of a few rows with one weight: mlxcel's quantized matvec kernel (its
default tactic and a few others) against MLX's `quantized_matmul` and the bf16 product.

The weights are the Llama-3.1-8B layers' shapes, 4-bit with group size 64 (as
`random_model.py --bits 4` writes them), bf16 activations. Each call cycles through
`COPIES` copies of the weight so that no call finds it in L2. Two figures per tactic, each
the median over `--repeats` groups of `--calls` calls, per call:
- "eval µs": the calls' graph built first, then evaluated (the device's time, where it is
  longer than MLX's encoding of a launch, ~5-10 µs);
- "built and eval µs": building the graph included (Python and MLX's per-operation cost,
  what a step pays while the host does not run ahead of the device).
"GB/s" is the weight's bytes as the tactic stores them (packed levels, scales and biases;
bf16 for the bf16 product) over the eval time. The measurements run most important first
(the gate/up and down shapes at one row, every tactic) and stop when `--seconds` have
passed, each line printed as it is measured; a kernel's first call includes compiling it.

    python benchmarks/quantized_matmul.py --seconds 40
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import mlx.core as mx

from mlxcel_core.kernels import CUDA
from mlxcel_core.kernels.quantized_matvec import (
    MAX_ROWS,
    MatvecTactic,
    default_tactic,
    quantized_matvec_kernel,
)

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
# Tactics beside each row count's default: one output a warp, longer steps, more outputs.
OTHER_TACTICS = (
    MatvecTactic(rows_per_warp=1, warps_per_block=4, unroll=2),
    MatvecTactic(rows_per_warp=2, warps_per_block=4, unroll=4),
    MatvecTactic(rows_per_warp=4, warps_per_block=2, unroll=1),
)
# (shape, rows, every tactic?) in the order they are measured.
PLAN = (
    ("gate/up", 1, True),
    ("down", 1, True),
    ("q/o", 1, False),
    ("k/v", 1, False),
    ("gate/up", 2, False),
    ("gate/up", 4, True),
    ("gate/up", 7, False),
    ("gate/up", 8, True),
    ("down", 4, False),
    ("down", 8, False),
    ("gate/up", 16, False),
)


def timed(function: Callable[[], mx.array], calls: int, repeats: int) -> tuple[float, float]:
    """Median seconds per call of `function`: evaluation alone, and building included."""
    mx.eval([function() for _ in range(calls)])
    evals, totals = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = [function() for _ in range(calls)]
        built = time.perf_counter()
        mx.eval(outputs)
        end = time.perf_counter()
        evals.append((end - built) / calls)
        totals.append((end - start) / calls)
    return statistics.median(evals), statistics.median(totals)


def cycling(functions: Sequence[Callable[[], mx.array]]) -> Callable[[], mx.array]:
    """One call of each function in turn."""
    state = {"next": 0}

    def call() -> mx.array:
        function = functions[state["next"] % len(functions)]
        state["next"] += 1
        return function()

    return call


Tactic = tuple[list[Callable[[], mx.array]], int]


def tactics_for(
    x: mx.array, dense: list[mx.array], quantized: list[tuple], every: bool
) -> dict[str, Tactic]:
    """Each tactic's calls (one per weight copy) and the weight bytes it reads."""

    def kernel(q, tactic):
        return quantized_matvec_kernel(
            x, *q, group_size=GROUP_SIZE, bits=BITS, backend=CUDA, tactic=tactic
        )

    def quantized_matmul(q):
        return mx.quantized_matmul(x, *q, transpose=True, group_size=GROUP_SIZE, bits=BITS)

    quantized_bytes = sum(a.nbytes for a in quantized[0])
    tactics = {
        "bf16 matmul": ([lambda w=w: x @ w.T for w in dense], dense[0].nbytes),
        "quantized_matmul": ([lambda q=q: quantized_matmul(q) for q in quantized], quantized_bytes),
    }
    rows = x.shape[0]
    if rows <= MAX_ROWS:
        chosen = (default_tactic(rows), *(OTHER_TACTICS if every else ()))
        for tactic in chosen:
            name = (
                f"kernel {tactic.rows_per_warp} rows/warp, {tactic.warps_per_block} "
                f"warps, unroll {tactic.unroll}"
                + (" (default)" if tactic == default_tactic(rows) else "")
            )
            calls = [lambda q=q, t=tactic: kernel(q, t) for q in quantized]
            tactics[name] = (calls, quantized_bytes)
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


class Weights:
    """`COPIES` bf16 copies of each shape's weight and their 4-bit copies, made once."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[list[mx.array], list[tuple]]] = {}

    def __getitem__(self, name: str) -> tuple[list[mx.array], list[tuple]]:
        if name not in self._made:
            self._made.clear()
            N, K = SHAPES[name]
            dense = [
                mx.random.normal((N, K), key=mx.random.key(i)).astype(mx.bfloat16)
                for i in range(COPIES)
            ]
            quantized = [mx.quantize(w, group_size=GROUP_SIZE, bits=BITS) for w in dense]
            mx.eval(dense, quantized)
            self._made[name] = (dense, quantized)
        return self._made[name]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="stop measuring after")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    print(mx.default_device(), mx.device_info().get("device_name", ""), flush=True)
    print("| weight | rows | tactic | eval µs | built and eval µs | GB/s of weight |")
    print("|---|---|---|---|---|---|", flush=True)
    weights = Weights()
    for name, rows, every in PLAN:
        N, K = SHAPES[name]
        dense, quantized = weights[name]
        x = mx.random.normal((rows, K)).astype(mx.bfloat16)
        label = f"| {name} ({N}x{K}) | {rows} |"
        if rows <= MAX_ROWS:
            print(f"{label} kernel error vs exact | {kernel_error(x, quantized[0]):.2e} | | |")
        for tactic, (functions, nbytes) in tactics_for(x, dense, quantized, every).items():
            if time.perf_counter() - start > args.seconds:
                print(f"stopped after {args.seconds:.0f} s", flush=True)
                return
            seconds, total = timed(cycling(functions), args.calls, args.repeats)
            print(
                f"{label} {tactic} | {seconds * 1e6:,.1f} | {total * 1e6:,.1f} | "
                f"{nbytes / seconds / 1e9:,.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
