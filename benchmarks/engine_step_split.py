"""Where the wall time of an engine step goes, with and without async scheduling.

Runs `batched_decode.py`'s engine workload and times, on the engine thread, each decode
step's `EngineCore.step`, and within it `_launch` (drafting, building the rows and the
model's graph, the draws, and handing them to MLX: host work only, since MLX is lazy) and
`_collect_oldest` (waiting for the oldest step's tokens, then updating and emitting). Steps
that prefill are left out: only steps after every prompt's first token are counted.

Synchronously (`--sync`, or the first of each pair with `--ab`) a step is launch, then
collect of the same step, so the device idles while the host builds. With async scheduling
the collect waits for step k while the device already has step k + 1, so the wait shrinks
by the build time when the device is the bottleneck (mlx-lm's `generate_step` does the same
with `mx.async_eval`). `--ab` runs both modes back to back per level and prints the ratio.

    python benchmarks/engine_step_split.py /tmp/l1b --concurrency 1,64 --ab
    python benchmarks/engine_step_split.py 8b4 --concurrency 1 --ab --gen-tokens 64
    python benchmarks/engine_step_split.py 1b --concurrency 1 --prompt-tokens 8192 \
        -ctk turbo4 -ctv turbo4

A model named `1b`, `8b` or `8b4` is `gpu_targets.py`'s random-weight shape, drawn on the
device (`target_models.ModelShelf`) instead of loaded from a folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence

import mlx.core as mx
from batched_decode import Run, random_prompts, run_mlxcel
from target_models import ModelShelf

from mlxcel_core.engine import EngineCore
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loading.loader import load_model

TARGET_SHAPES = ("1b", "8b", "8b4")
# The most prompt tokens of one request in one forward pass (the server's `-ub`).
PREFILL_CHUNK = 512


class StepTimes:
    """Per-step wall seconds of a step and of its launch and collect."""

    def __init__(self) -> None:
        self.launch: list[float] = []
        self.collect: list[float] = []
        self.total: list[float] = []
        self._launch = 0.0
        self._collect = 0.0

    def wrap_part(self, part: Callable, into: str) -> Callable:
        def timed(core: EngineCore, *args):
            start = time.perf_counter()
            try:
                return part(core, *args)
            finally:
                setattr(self, into, getattr(self, into) + time.perf_counter() - start)

        return timed

    def wrap_step(self, step: Callable[[EngineCore], None]) -> Callable[[EngineCore], None]:
        def timed(core: EngineCore) -> None:
            self._launch = self._collect = 0.0
            start = time.perf_counter()
            step(core)
            self.total.append(time.perf_counter() - start)
            self.launch.append(self._launch)
            self.collect.append(self._collect)

        return timed


def measure(
    loaded,
    prompts: Sequence[Sequence[int]],
    gen_tokens: int,
    async_scheduling: bool,
    cache_types: tuple[str, str] = ("auto", "auto"),
) -> tuple[StepTimes, Run]:
    """Step times of one `run_mlxcel` over `prompts`, decode steps only, and its result;
    `cache_types` are the KV cache's key and value storage types."""
    times = StepTimes()
    step, launch, collect = EngineCore.step, EngineCore._launch, EngineCore._collect_oldest
    EngineCore.step = times.wrap_step(step)
    EngineCore._launch = times.wrap_part(launch, "_launch")
    EngineCore._collect_oldest = times.wrap_part(collect, "_collect")
    try:
        result = run_mlxcel(
            loaded,
            prompts,
            gen_tokens,
            cache_type_k=cache_types[0],
            cache_type_v=cache_types[1],
            max_prefill_chunk=PREFILL_CHUNK,
            async_scheduling=async_scheduling,
        )
    finally:
        EngineCore.step, EngineCore._launch, EngineCore._collect_oldest = step, launch, collect
    # The first steps prefill (at least a chunk of a prompt each); decode steps follow.
    chunks = max(math.ceil(len(prompt) / PREFILL_CHUNK) for prompt in prompts)
    skip = len(prompts) * chunks + 2
    times.launch, times.collect, times.total = (
        times.launch[skip:],
        times.collect[skip:],
        times.total[skip:],
    )
    return times, result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "model", help="an mlx-lm / Hugging Face safetensors folder, or 1b, 8b or 8b4"
    )
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each mode per level")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sync", action="store_true", help="synchronous steps only")
    mode.add_argument("--ab", action="store_true", help="synchronous, then async, per round")
    parser.add_argument("-ctk", "--cache-type-k", default="auto", help="KV key storage")
    parser.add_argument("-ctv", "--cache-type-v", default="auto", help="KV value storage")
    parser.add_argument(
        "--plain-ops", action="store_true", help="keep MLX's own RoPE and RMSNorm on the CPU"
    )
    args = parser.parse_args(argv)
    modes = [False, True] if args.ab else [not args.sync]

    options = ComputeOptions.for_device(mx.default_device())
    if args.plain_ops:
        options = dataclasses.replace(options, cpu_ops=False)
    if args.model in TARGET_SHAPES:
        if args.plain_ops:
            parser.error("--plain-ops takes a model folder, not a target shape")
        loaded = ModelShelf("llama-3.2-1b", "llama-3.1-8b").get(args.model).ours
    else:
        loaded = load_model(args.model, compute=options)
    vocab_size = loaded.tokenizer.vocab_size
    cache_types = (args.cache_type_k, args.cache_type_v)
    warm_up = random_prompts(2, args.prompt_tokens, vocab_size)
    run_mlxcel(loaded, warm_up, 8, cache_type_k=cache_types[0], cache_type_v=cache_types[1])
    print("| N | mode | step ms | launch ms | collect ms | rest ms | decode tok/s |")
    print("|---|---|---|---|---|---|---|")
    for level in (int(level) for level in args.concurrency.split(",")):
        prompts = random_prompts(level, args.prompt_tokens, vocab_size, seed=level)
        decode: dict[bool, list[float]] = {mode: [] for mode in modes}
        for _ in range(args.rounds):
            for async_scheduling in modes:
                times, result = measure(
                    loaded, prompts, args.gen_tokens, async_scheduling, cache_types
                )
                step, launch, collect = (
                    statistics.median(values) * 1000
                    for values in (times.total, times.launch, times.collect)
                )
                decode[async_scheduling].append(result.decode_tps)
                print(
                    f"| {level} | {'async' if async_scheduling else 'sync'} | {step:.2f} | "
                    f"{launch:.2f} | {collect:.2f} | {step - launch - collect:.2f} | "
                    f"{result.decode_tps:.1f} |",
                    flush=True,
                )
        if args.ab:
            ratio = statistics.median(decode[True]) / statistics.median(decode[False])
            print(f"N={level}: async / sync decode tok/s (medians of {args.rounds}): {ratio:.2f}x")


if __name__ == "__main__":
    main()
