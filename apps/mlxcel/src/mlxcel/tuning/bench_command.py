"""`mlxcel bench`: prefill and decode speed, optionally against mlx-lm on the same weights.

Both implementations are timed by the same harness: prefill time runs from the call until
the first sampled token is on the host; decode speed counts the remaining tokens over the
time after it. Decoding is greedy and ignores end-of-sequence tokens, as llama-bench does.
mlx-lm's `generate_step` runs the same architecture class on the same tensors, loaded as
mlx-lm holds them: the file's dtypes and MLX's quantized kernels only. The two models are
loaded one after the other, so memory never holds both.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TextIO

import mlx.core as mx
from mlx_lm.generate import generate_step

from mlxcel.common.autotune_settings import apply_autotune
from mlxcel.common.flags import (
    BATCH_SIZE_FLAG,
    MODEL_FLAG,
    Flag,
    UsageError,
    add_command,
    resolve_defaults,
)
from mlxcel.common.gguf_flags import GGUF_DEQUANT_FLAG
from mlxcel.common.kernel_flags import METAL_KERNELS_FLAG, apply_kernel_flags
from mlxcel.common.llama_server_flags import LLAMA_SERVER_FLAGS, apply_llama_server_flags
from mlxcel.common.loading import compute_options, load_for_command
from mlxcel.common.surgery_flags import SURGERY_FLAG, surgery_plan_from
from mlxcel.models.store_flags import STORE_FLAGS, resolve_store_flags
from mlxcel_core.generate import generate_tokens
from mlxcel_core.sampling import Sampler, SamplingParams
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loaded import LoadedModel

BENCH_FLAGS = (
    MODEL_FLAG,
    *STORE_FLAGS,
    BATCH_SIZE_FLAG,
    Flag(("-p", "--n-prompt"), "n_prompt", int, 512, "prompt tokens to prefill"),
    Flag(("-n", "--n-gen"), "n_gen", int, 128, "tokens to generate"),
    Flag(("-r", "--repetitions"), "repetitions", int, 3, "runs per implementation (median)"),
    Flag(("--compare",), "compare", bool, False,
         "also run mlx-lm's generate_step on the same weights and print the ratios",
         is_switch=True),
    SURGERY_FLAG,
    GGUF_DEQUANT_FLAG,
    METAL_KERNELS_FLAG,
    *LLAMA_SERVER_FLAGS,
)  # fmt: skip

GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)

TokenStream = Callable[[list[int]], Iterator[int]]


@dataclass(frozen=True)
class BenchResult:
    """Median speeds of one implementation (tokens/s) and its peak memory (bytes)."""

    name: str
    prompt_tps: float
    decode_tps: float
    peak_memory_bytes: int


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    add_command(subparsers, "bench", __doc__, BENCH_FLAGS, run)


def _mlxcel_stream(loaded: LoadedModel, batch_size: int) -> TokenStream:
    def stream(prompt: list[int]) -> Iterator[int]:
        return generate_tokens(loaded.model, prompt, Sampler(GREEDY), prefill_step_size=batch_size)

    return stream


def _mlx_lm_stream(loaded: LoadedModel, batch_size: int, max_tokens: int) -> TokenStream:
    def stream(prompt: list[int]) -> Iterator[int]:
        steps = generate_step(
            mx.array(prompt),
            loaded.model.module,
            max_tokens=max_tokens,
            sampler=lambda logprobs: mx.argmax(logprobs, axis=-1),
            prefill_step_size=batch_size,
        )
        return (token for token, _ in steps)

    return stream


def time_run(stream: TokenStream, prompt: list[int], n_gen: int) -> tuple[float, float]:
    """Prefill and decode speed (tokens/s) of one run."""
    start = time.perf_counter()
    first = start
    generated = 0
    for _ in stream(prompt):
        generated += 1
        if generated == 1:
            first = time.perf_counter()
        if generated == n_gen:
            break
    end = time.perf_counter()
    decode_tps = (generated - 1) / (end - first) if generated > 1 else 0.0
    return len(prompt) / (first - start), decode_tps


def measure(
    name: str, stream: TokenStream, prompt: list[int], args: argparse.Namespace
) -> BenchResult:
    time_run(stream, prompt[:16], 4)
    prompt_speeds, decode_speeds = [], []
    mx.reset_peak_memory()
    for _ in range(args.repetitions):
        prompt_tps, decode_tps = time_run(stream, prompt, args.n_gen)
        prompt_speeds.append(prompt_tps)
        decode_speeds.append(decode_tps)
    return BenchResult(
        name,
        statistics.median(prompt_speeds),
        statistics.median(decode_speeds),
        mx.get_peak_memory(),
    )


def format_results(results: list[BenchResult], args: argparse.Namespace) -> str:
    lines = [
        f"prompt {args.n_prompt} tokens, generate {args.n_gen} tokens, "
        f"median of {args.repetitions}, device {mx.default_device()}",
        f"{'implementation':<16}{'prompt tok/s':>14}{'gen tok/s':>12}{'peak MiB':>11}",
    ]
    for result in results:
        lines.append(
            f"{result.name:<16}{result.prompt_tps:>14.1f}{result.decode_tps:>12.1f}"
            f"{result.peak_memory_bytes / 2**20:>11.1f}"
        )
    if len(results) == 2:
        ours, theirs = results
        lines.append(
            f"ratio mlxcel/mlx-lm: prompt {ours.prompt_tps / theirs.prompt_tps:.2f}x, "
            f"generation {ours.decode_tps / theirs.decode_tps:.2f}x"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    resolve_defaults(args, BENCH_FLAGS, environ)
    apply_llama_server_flags(args, err)
    resolve_store_flags(args, environ)
    apply_autotune(args, environ, err, BATCH_SIZE_FLAG)
    apply_kernel_flags(args)
    for name, value, low in (
        ("-p/--n-prompt", args.n_prompt, 1),
        ("-n/--n-gen", args.n_gen, 2),
        ("-r/--repetitions", args.repetitions, 1),
        ("-b/--batch-size", args.batch_size, 1),
    ):
        if value < low:
            raise UsageError(f"{name} must be >= {low}, got {value}")
    surgery = surgery_plan_from(args)
    results = []
    if args.compare:
        reference = load_for_command(
            args.model,
            store=args.model_store,
            revision=args.revision,
            compute=ComputeOptions(),
            surgery=surgery,
            gguf_dequant=args.gguf_dequant,
        )
        if reference.image_prompter is not None:
            raise UsageError(
                "--compare runs mlx-lm's text models; a vision-language model has no "
                "mlx-lm counterpart"
            )
        prompt = _random_prompt(reference, args.n_prompt)
        stream = _mlx_lm_stream(reference, args.batch_size, args.n_gen)
        results.append(measure("mlx-lm", stream, prompt, args))
        del reference, stream
        gc.collect()
        mx.clear_cache()
    loaded = load_for_command(
        args.model,
        store=args.model_store,
        revision=args.revision,
        compute=compute_options(1),  # one sequence, as generate runs one prompt
        surgery=surgery,
        gguf_dequant=args.gguf_dequant,
    )
    prompt = _random_prompt(loaded, args.n_prompt)
    results.insert(0, measure("mlxcel", _mlxcel_stream(loaded, args.batch_size), prompt, args))
    print(format_results(results, args), file=out)
    return 0


def _random_prompt(loaded: LoadedModel, length: int) -> list[int]:
    return mx.random.randint(0, loaded.config.vocab_size, (length,), key=mx.random.key(0)).tolist()
