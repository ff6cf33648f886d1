"""How many MLX operations one engine decode step launches, counted in its graph.

Steps an `EngineCore` (no threads, synchronous steps so that each step's graph starts from
evaluated arrays) over N requests until every one has its first token, then captures the
next decode step's graph where the core hands it to `mx.async_eval`: the forward passes,
the KV writes and the draws. `mx.export_to_dot` writes that graph; every primitive in it
is one operation the device runs (on a GPU, one kernel launch or more). Prints the total and
the count per primitive. `--plain-ops` loads the model without the CPU forms of RoPE and
RMSNorm (`mlxcel_models.cpu_ops`), as before they existed.

    python benchmarks/random_model.py llama-3.2-1b /tmp/l1b
    python benchmarks/step_ops.py /tmp/l1b --concurrency 1,16
    python benchmarks/step_ops.py /tmp/l1b --concurrency 1,16 --plain-ops
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
from batched_decode import random_prompts

from mlxcel_core.engine import (
    EngineConfig,
    EngineCore,
    EngineRequest,
    OutputQueue,
    RequestHandle,
    SchedulerConfig,
    Submission,
)
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loading.loader import load_model

_PRIMITIVE = re.compile(r'\[label ="([^"]+)", shape=rectangle\]')


def count_ops(arrays: Sequence[mx.array]) -> Counter[str]:
    """The primitives of the unevaluated graph behind `arrays`, by name."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "step.dot"
        mx.export_to_dot(str(path), *arrays)
        return Counter(_PRIMITIVE.findall(path.read_text()))


def decode_step_ops(loaded, num_rows: int, prompt_tokens: int, temperature: float) -> Counter[str]:
    """The operations of one decode step over `num_rows` sequences."""
    context = prompt_tokens + 16
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=num_rows, max_num_batched_tokens=4096),
        context_size=context,
        enable_prefix_caching=False,
        async_scheduling=False,
    )
    core = EngineCore(loaded.model, config)
    prompts = random_prompts(num_rows, prompt_tokens, loaded.tokenizer.vocab_size, seed=1)
    sink = OutputQueue()
    generation = GenerationConfig(context_size=context, max_tokens=8)
    sampling = SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=0)
    for index, prompt in enumerate(prompts):
        request = EngineRequest(
            tuple(prompt), sampling, generation, loaded.tokenizer.make_detokenizer(), index=index
        )
        core.admit(Submission(index, request, sink, RequestHandle(index)), {})
    while not all(sequence.num_generated for sequence in core.sequences):
        core.step()
    captured: list[Counter[str]] = []
    launch = mx.async_eval

    def counting_launch(*arrays) -> None:
        captured.append(count_ops([a for group in arrays for a in group]))
        launch(*arrays)

    mx.async_eval = counting_launch
    try:
        core.step()
    finally:
        mx.async_eval = launch
    return captured[0]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an mlx-lm / Hugging Face safetensors folder")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top", type=int, default=12, help="primitives listed per level")
    parser.add_argument("--plain-ops", action="store_true", help="keep MLX's own RoPE and RMSNorm")
    args = parser.parse_args(argv)
    options = ComputeOptions.for_device(mx.default_device())
    if args.plain_ops:
        options = dataclasses.replace(options, cpu_ops=False)
    loaded = load_model(args.model, compute=options)
    for level in (int(level) for level in args.concurrency.split(",")):
        ops = decode_step_ops(loaded, level, args.prompt_tokens, args.temperature)
        listed = ", ".join(f"{name} {count}" for name, count in ops.most_common(args.top))
        print(f"N={level}: {sum(ops.values())} operations per decode step ({listed})")


if __name__ == "__main__":
    main()
