"""How many MLX operations one engine decode step launches, counted in its graph.

Steps an `EngineCore` (no threads, synchronous steps so that each step's graph starts from
evaluated arrays) over N requests until every one has its first token, then captures the
next decode step's graph where the core hands it to `mx.async_eval`: the forward passes,
the KV writes and the draws. `mx.export_to_dot` writes that graph; every primitive in it
is one operation the device runs (on a GPU, one kernel launch or more). Prints the total and
the count per primitive. `--plain-ops` loads the model without the CPU forms of RoPE and
RMSNorm (`mlxcel_models.cpu_ops`), as before they existed.

`--cuda-path` counts the step a CUDA GPU would run, on any machine: the model loaded with
CUDA's compute options, `kernel_backend` naming CUDA wherever mlxcel asks, and each launch
of an mlxcel kernel replaced by a stand-in that computes nothing and is counted as one
`Kernel`. Without a GPU, MLX builds its fast operations (RoPE, RMSNorm, attention) from
the plain operations they fall back to on the CPU, so the totals overstate a GPU step's;
differences between two runs that share those (cache types, say) hold. `-ctk`/`-ctv`
choose the KV cache's types (with `--cache-residual`, as the server's flags),
`--prompt-tokens` the context the step reads.

    python benchmarks/random_model.py llama-3.2-1b /tmp/l1b
    python benchmarks/step_ops.py /tmp/l1b --concurrency 1,16
    python benchmarks/step_ops.py /tmp/l1b --concurrency 1,16 --plain-ops
    python benchmarks/step_ops.py /tmp/l1b --concurrency 1 --cuda-path --prompt-tokens 1100 \
        -ctk turbo4 -ctv turbo4
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
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
from mlxcel_core.kernels import options as kernel_options
from mlxcel_core.kernels.backend import CUDA
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.compute import CUDA_DEQUANTIZE_MIN_ROWS, ComputeOptions
from mlxcel_models.loading.loader import load_model

_PRIMITIVE = re.compile(r'\[label ="([^"]+)", shape=rectangle\]')


def count_ops(arrays: Sequence[mx.array]) -> Counter[str]:
    """The primitives of the unevaluated graph behind `arrays`, by name; a kernel's
    stand-in (`cuda_path`) as `Kernel`."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "step.dot"
        mx.export_to_dot(str(path), *arrays)
        counts = Counter(_PRIMITIVE.findall(path.read_text()))
    if "Depends" in counts:
        counts["Kernel"] = counts.pop("Depends")
    return counts


class _KernelStandIn:
    """What `mx.fast.cuda_kernel` builds, for counting: each launch gives evaluated zeros
    of its output shapes behind one `Depends` on its inputs."""

    def __init__(self, **_) -> None:
        pass

    def __call__(self, *, inputs, output_shapes, output_dtypes, **_) -> list[mx.array]:
        outputs = [
            mx.zeros(shape, dtype)
            for shape, dtype in zip(output_shapes, output_dtypes, strict=True)
        ]
        mx.eval(outputs)
        return mx.depends(outputs, list(inputs))


@contextlib.contextmanager
def cuda_path() -> Iterator[None]:
    """Within it, mlxcel takes its CUDA paths on any device, with kernel stand-ins."""
    real = kernel_options.kernel_backend
    modules = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("mlxcel") and getattr(module, "kernel_backend", None) is real
    ]
    builder = getattr(mx.fast, "cuda_kernel", None)
    for module in modules:
        module.kernel_backend = lambda device: CUDA
    mx.fast.cuda_kernel = _KernelStandIn
    try:
        yield
    finally:
        for module in modules:
            module.kernel_backend = real
        mx.fast.cuda_kernel = builder


def decode_step_ops(
    loaded,
    num_rows: int,
    prompt_tokens: int,
    temperature: float,
    cache_types: tuple[str, str] = ("auto", "auto"),
    cache_residual: int | None = None,
) -> Counter[str]:
    """The operations of one decode step over `num_rows` sequences."""
    context = prompt_tokens + 16
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=num_rows, max_num_batched_tokens=4096),
        context_size=context,
        enable_prefix_caching=False,
        async_scheduling=False,
        cache_type_k=cache_types[0],
        cache_type_v=cache_types[1],
        cache_residual=cache_residual,
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
    parser.add_argument("--cuda-path", action="store_true", help="count what CUDA would run")
    parser.add_argument("-ctk", "--cache-type-k", default="auto", help="KV key storage")
    parser.add_argument("-ctv", "--cache-type-v", default="auto", help="KV value storage")
    parser.add_argument("--cache-residual", type=int, default=None, help="None: the default")
    args = parser.parse_args(argv)
    if args.cuda_path and args.plain_ops:
        parser.error("--plain-ops is the CPU's; --cuda-path takes CUDA's compute options")
    options = ComputeOptions.for_device(mx.default_device())
    if args.plain_ops:
        options = dataclasses.replace(options, cpu_ops=False)
    if args.cuda_path:
        options = ComputeOptions(dequantize_min_rows=CUDA_DEQUANTIZE_MIN_ROWS)
    loaded = load_model(args.model, compute=options)
    cache_types = (args.cache_type_k, args.cache_type_v)
    with cuda_path() if args.cuda_path else contextlib.nullcontext():
        for level in (int(level) for level in args.concurrency.split(",")):
            ops = decode_step_ops(
                loaded,
                level,
                args.prompt_tokens,
                args.temperature,
                cache_types,
                args.cache_residual,
            )
            listed = ", ".join(f"{name} {count}" for name, count in ops.most_common(args.top))
            print(f"N={level}: {sum(ops.values())} operations per decode step ({listed})")


if __name__ == "__main__":
    main()
