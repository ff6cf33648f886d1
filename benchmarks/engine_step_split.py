"""Where the wall time of an engine step goes: building the step's MLX graph, evaluating
it, and the engine's bookkeeping around them.

Runs `batched_decode.py`'s engine workload and times, on the engine thread, each step's
`_forward_and_sample` (scheduling is done; this builds the forward pass and the draws, host
work only, since MLX is lazy), its `mx.eval` calls (launching the step's operations and
waiting for the device), and the rest of `_step` (scheduling, emitting tokens). Steps that
prefill are left out: only steps after every prompt's first token are counted. The engine
evaluates each step before building the next, so these add up to the step; a loop that
builds step k + 1 while the device runs step k (mlx-lm's `generate_step`, with
`mx.async_eval`) hides the building behind the device.

    python benchmarks/engine_step_split.py /tmp/l1b --concurrency 1,64
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import mlx.core as mx
from batched_decode import random_prompts, run_mlxcel

from mlxcel_core.engine import Engine
from mlxcel_models.loading.loader import load_model


class StepTimes:
    """Per-step wall seconds of the three parts, on the engine thread."""

    def __init__(self) -> None:
        self.build: list[float] = []
        self.evaluate: list[float] = []
        self.total: list[float] = []
        self._evaluating = 0.0

    def wrap_eval(self, evaluate: Callable[..., None]) -> Callable[..., None]:
        def timed(*arrays) -> None:
            if threading.current_thread().name != "mlxcel-engine":
                return evaluate(*arrays)
            start = time.perf_counter()
            try:
                return evaluate(*arrays)
            finally:
                self._evaluating += time.perf_counter() - start

        return timed

    def wrap_step(self, step: Callable[[Engine], None], build: Callable) -> tuple:
        def timed_build(engine: Engine, plan):
            start = time.perf_counter()
            try:
                return build(engine, plan)
            finally:
                self.build.append(time.perf_counter() - start)

        def timed_step(engine: Engine) -> None:
            self._evaluating = 0.0
            builds = len(self.build)
            start = time.perf_counter()
            step(engine)
            if len(self.build) > builds:
                self.total.append(time.perf_counter() - start)
                self.evaluate.append(self._evaluating)

        return timed_step, timed_build


def measure(loaded, prompts: Sequence[Sequence[int]], gen_tokens: int) -> StepTimes:
    """Step times of one `run_mlxcel` over `prompts`, decode steps only."""
    times = StepTimes()
    step, build, evaluate = Engine._step, Engine._forward_and_sample, mx.eval
    Engine._step, Engine._forward_and_sample = times.wrap_step(step, build)
    mx.eval = times.wrap_eval(evaluate)
    try:
        run_mlxcel(loaded, prompts, gen_tokens)
    finally:
        Engine._step, Engine._forward_and_sample, mx.eval = step, build, evaluate
    # The first steps prefill (one chunk of every prompt); decode steps follow.
    skip = len(prompts) + 1
    times.build, times.evaluate, times.total = (
        times.build[skip:],
        times.evaluate[skip:],
        times.total[skip:],
    )
    return times


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an mlx-lm / Hugging Face safetensors folder")
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--gen-tokens", type=int, default=128)
    args = parser.parse_args(argv)

    loaded = load_model(args.model)
    vocab_size = loaded.tokenizer.vocab_size
    run_mlxcel(loaded, random_prompts(2, args.prompt_tokens, vocab_size), 8)  # warm-up
    print("| N | step ms | build ms | eval ms | rest ms | decode tok/s |")
    print("|---|---|---|---|---|---|")
    for level in (int(level) for level in args.concurrency.split(",")):
        prompts = random_prompts(level, args.prompt_tokens, vocab_size, seed=level)
        times = measure(loaded, prompts, args.gen_tokens)
        step, build, evaluate = (
            statistics.median(values) * 1000
            for values in (times.total, times.build, times.evaluate)
        )
        print(
            f"| {level} | {step:.2f} | {build:.2f} | {evaluate:.2f} | "
            f"{step - build - evaluate:.2f} | {level * 1000 / step:.1f} |"
        )


if __name__ == "__main__":
    main()
