"""The engine thread's own CPU time per step during batched decode, and where it goes.

Runs `batched_decode.py`'s engine workload (N greedy or `--temperature` requests, distinct
random prompts, no stop token) on the engine thread's CPU clock (`time.thread_time`),
plainly and under cProfile with that clock as the timer, so other processes on a shared
machine and the time spent waiting on the device do not count: what remains is the host
work of scheduling, building batches, building the MLX graph, sampling and emitting.
Prints the CPU milliseconds per step, measured once without the profiler (which slows
every Python call) and once under it, and the costliest calls.

    python benchmarks/engine_step_cost.py /tmp/tinyllama --concurrency 16,64
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import time
from collections.abc import Sequence

import mlx.core as mx
from batched_decode import random_prompts, run_mlxcel

from mlxcel_core.engine import Engine
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loading.loader import load_model

_ENGINE_MODULES = r"mlxcel_core/(engine|sampling|cache|kernels)/"


def engine_cpu_seconds(
    loaded,
    prompts: Sequence[Sequence[int]],
    gen_tokens: int,
    temperature: float,
    profile: cProfile.Profile | None,
    **settings,
) -> float:
    """The engine thread's CPU seconds over one `run_mlxcel` with `settings` (its keyword
    arguments), profiled into `profile` if given."""
    spent = []
    run = Engine._run

    def measured_run(engine: Engine) -> None:
        start = time.thread_time()
        if profile is not None:
            profile.enable()
        try:
            run(engine)
        finally:
            if profile is not None:
                profile.disable()
            spent.append(time.thread_time() - start)

    Engine._run = measured_run
    try:
        run_mlxcel(loaded, prompts, gen_tokens, temperature, **settings)
    finally:
        Engine._run = run
    return spent[0]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an mlx-lm / Hugging Face safetensors folder")
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top", type=int, default=15, help="calls listed per level")
    parser.add_argument("-ctk", "--cache-type-k", default="auto", help="the KV key storage")
    parser.add_argument("-ctv", "--cache-type-v", default="auto", help="the KV value storage")
    parser.add_argument(
        "--sync", action="store_true", help="read each step before planning the next"
    )
    parser.add_argument(
        "--plain-ops", action="store_true", help="keep MLX's own RoPE and RMSNorm on the CPU"
    )
    args = parser.parse_args(argv)
    settings = {
        "cache_type_k": args.cache_type_k,
        "cache_type_v": args.cache_type_v,
        "async_scheduling": not args.sync,
    }

    options = ComputeOptions.for_device(mx.default_device())
    if args.plain_ops:
        options = dataclasses.replace(options, cpu_ops=False)
    loaded = load_model(args.model, compute=options)
    vocab_size = loaded.tokenizer.vocab_size
    # The first run compiles kernels; it is not reported.
    run_mlxcel(loaded, random_prompts(2, args.prompt_tokens, vocab_size), 8, **settings)
    for level in (int(level) for level in args.concurrency.split(",")):
        prompts = random_prompts(level, args.prompt_tokens, vocab_size, seed=level)
        seconds = engine_cpu_seconds(
            loaded, prompts, args.gen_tokens, args.temperature, None, **settings
        )
        profile = cProfile.Profile(timer=time.thread_time)
        engine_cpu_seconds(loaded, prompts, args.gen_tokens, args.temperature, profile, **settings)
        stats = pstats.Stats(profile)
        num_steps = next(
            calls
            for (path, _, name), (_, calls, *_) in stats.stats.items()  # type: ignore[attr-defined]
            if name == "step" and path.endswith("engine/core.py")
        )
        print(
            f"N={level}: engine thread {seconds * 1000 / num_steps:.2f} ms CPU per step "
            f"({num_steps} steps); under the profiler "
            f"{stats.total_tt * 1000 / num_steps:.2f} ms"
        )
        stats.sort_stats("cumulative").print_stats(_ENGINE_MODULES, args.top)


if __name__ == "__main__":
    main()
