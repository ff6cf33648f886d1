"""Quantized weights (dequantized per prefill chunk) against dense float32 weights on the CPU.

Loads the model twice with the two `ComputeOptions` that docs/adr/0003 and 0004 compare and
times, for each, one 512-token prefill (best of 3) and 10 decode steps at batch 1, 4 and 16
after a 64-token prompt (random-free: the token ids are fixed). Run it with and without
OpenBLAS preloaded:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        uv run python benchmarks/cpu_weights.py
    uv run python benchmarks/cpu_weights.py
    uv run python benchmarks/cpu_weights.py -m model.gguf
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx

from mlxcel_models.compute import CPU_DEQUANTIZE_MIN_ROWS, ComputeOptions
from mlxcel_models.default_model import default_model_path
from mlxcel_models.loading.loader import load_model

VARIANTS = {
    "quantized, dense prefill": ComputeOptions(
        float_dtype=mx.float32, dequantize_min_rows=CPU_DEQUANTIZE_MIN_ROWS
    ),
    "dense float32": ComputeOptions(float_dtype=mx.float32, dense_weights_max_bytes=2**62),
}
BATCH_SIZES = (1, 4, 16)
DECODE_STEPS = 10


def prefill_tokens_per_second(model, num_tokens: int = 512, repetitions: int = 3) -> float:
    tokens = mx.array([[5 + i % 1000 for i in range(num_tokens)]])
    best = float("inf")
    for _ in range(repetitions):
        cache = model.make_cache()
        start = time.perf_counter()
        mx.eval(model(tokens, cache, last_only=True))
        best = min(best, time.perf_counter() - start)
    return num_tokens / best


def decode_tokens_per_second(model, batch_size: int, context: int = 64) -> float:
    cache = model.make_cache()
    mx.eval(model(mx.full((batch_size, context), 7, dtype=mx.int32), cache, last_only=True))
    step = mx.full((batch_size, 1), 7, dtype=mx.int32)
    mx.eval(model(step, cache, last_only=True))  # warm-up
    start = time.perf_counter()
    for _ in range(DECODE_STEPS):
        mx.eval(model(step, cache, last_only=True))
    return batch_size * DECODE_STEPS / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=None, help="GGUF file or folder")
    args = parser.parse_args()
    path = args.model or default_model_path()
    header = "".join(f"{f'decode B={b}':>14}" for b in BATCH_SIZES)
    print(f"{'weights':<26}{'prefill 512':>13}{header}   (tokens/s)")
    for name, options in VARIANTS.items():
        model = load_model(path, compute=options).model
        decode = "".join(f"{decode_tokens_per_second(model, b):>14.1f}" for b in BATCH_SIZES)
        print(f"{name:<26}{prefill_tokens_per_second(model):>13.1f}{decode}", flush=True)


if __name__ == "__main__":
    main()
