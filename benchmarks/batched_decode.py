"""Batched decode throughput: mlxcel's continuous-batching engine against mlx-lm's batch_generate.

For each concurrency N, N requests with distinct random prompts of `--prompt-tokens` tokens
each generate `--gen-tokens` tokens, greedy, with no stop token (as llama-bench does), all
submitted at once. `--temperature` above 0 samples instead, at that temperature with no
truncation (each engine request seeded with its index; mlx-lm shares one sampler). Both
implementations run the same weights; the model is loaded once by each, one after the
other. `--cache-type-k/-v` choose how mlxcel's KV cache stores keys and values (mlx-lm keeps
the model's dtype).

Reported per N and implementation:
- decode tok/s: tokens sampled after each request's first token, over the time from the
  moment every request had its first token to the last token. For mlx-lm this is its own
  `BatchStats.generation_tps` (generation tokens over generation time), which counts the
  same phase.
- total tok/s: every generated token over the whole run, prefill included.

    python benchmarks/batched_decode.py /tmp/llama-1b --concurrency 1,8,32,64
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.generate import batch_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load as mlx_lm_load

from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineOutput,
    EngineRequest,
    OutputQueue,
    SchedulerConfig,
)
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.speculative import SpeculativeConfig
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.loading.loader import load_model

OUTPUT_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True)
class Run:
    """One implementation at one concurrency.

    Attributes:
        decode_tps: decode tokens per second (see the module docstring).
        total_tps: generated tokens per second over the whole run.
        draft_tokens: draft tokens verified, over every request (0 without a draft model).
        accepted_draft_tokens: of those, the ones accepted.
    """

    decode_tps: float
    total_tps: float
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0


def random_prompts(count: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts of `length` token ids drawn uniformly, none sharing a first block."""
    generator = np.random.default_rng(seed)
    return generator.integers(1, vocab_size, size=(count, length)).tolist()


def mlxcel_engine(
    loaded,
    rows: int,
    context: int,
    *,
    paged_decode_kernel: bool = True,
    cache_type_k: str = "auto",
    cache_type_v: str = "auto",
    draft: LoadedModel | None = None,
    speculative: SpeculativeConfig | None = None,
    max_prefill_chunk: int = 512,
    async_scheduling: bool = True,
) -> Engine:
    """An engine for up to `rows` requests at once of up to `context` positions each, as
    `run_mlxcel` describes its settings; the caller shuts it down."""
    return Engine(
        loaded.model,
        EngineConfig(
            scheduler=SchedulerConfig(
                max_num_seqs=rows,
                max_num_batched_tokens=max(2048, rows, max_prefill_chunk),
                max_prefill_chunk=max_prefill_chunk,
            ),
            context_size=context,
            enable_prefix_caching=False,
            paged_decode_kernel=paged_decode_kernel,
            cache_type_k=cache_type_k,
            cache_type_v=cache_type_v,
            speculative=speculative,
            async_scheduling=async_scheduling,
        ),
        draft_model=None if draft is None else draft.model,
    )


def run_mlxcel(
    loaded,
    prompts: Sequence[Sequence[int]],
    gen_tokens: int,
    temperature: float = 0.0,
    **settings,
) -> Run:
    """Every prompt through one new engine with `len(prompts)` slots (`run_requests`).

    Settings (keywords of `mlxcel_engine`): `paged_decode_kernel` False makes decode gather
    the KV, then attend; `cache_type_k/v` are the KV cache's storage types
    (`mlxcel_core.cache.quant.CACHE_TYPES`); `draft` (a loaded model) drafts for the model
    as `speculative` says; `max_prefill_chunk` is the most prompt tokens of one request in
    one forward pass (the server's `-ub`); `async_scheduling` False reads each step before
    planning the next.

    Raises:
        RuntimeError: a request failed.
        ValueError: `draft` is given without `speculative`, or the reverse.
    """
    engine = mlxcel_engine(loaded, len(prompts), len(prompts[0]) + gen_tokens + 1, **settings)
    try:
        return run_requests(engine, loaded, prompts, gen_tokens, temperature)
    finally:
        engine.shutdown()


def run_requests(
    engine: Engine,
    loaded,
    prompts: Sequence[Sequence[int]],
    gen_tokens: int,
    temperature: float = 0.0,
) -> Run:
    """Every prompt through `engine` at once; no stop token; greedy at temperature 0, else
    sampled at `temperature` without truncation, seeded per request. An engine that lives
    across calls keeps what its thread caches (CUDA attention plans), as a server's does.

    Raises:
        RuntimeError: a request failed.
    """
    generation = GenerationConfig(
        context_size=len(prompts[0]) + gen_tokens + 1, max_tokens=gen_tokens
    )
    sink = OutputQueue()
    start = time.perf_counter()
    engine.submit(
        [
            EngineRequest(
                prompt_ids=tuple(prompt),
                sampling=SamplingParams(
                    temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=index
                ),
                generation=generation,
                detokenizer=loaded.tokenizer.make_detokenizer(),
                index=index,
            )
            for index, prompt in enumerate(prompts)
        ],
        sink,
    )
    first_token_at: dict[int, float] = {}
    tokens = 0
    finished = 0
    draft_tokens = 0
    accepted_draft_tokens = 0
    while finished < len(prompts):
        output: EngineOutput = sink.get(timeout=OUTPUT_TIMEOUT_SECONDS)
        if output.error is not None:
            raise RuntimeError(f"request {output.index} failed: {output.error}")
        if output.token_id is not None:
            tokens += 1
            first_token_at.setdefault(output.index, time.perf_counter())
        if output.finish_reason is not None:
            finished += 1
            draft_tokens += output.stats.draft_tokens
            accepted_draft_tokens += output.stats.accepted_draft_tokens
    end = time.perf_counter()
    decode_start = max(first_token_at.values())
    decode_tokens = tokens - len(prompts)
    return Run(
        decode_tokens / (end - decode_start) if decode_tokens else 0.0,
        tokens / (end - start),
        draft_tokens,
        accepted_draft_tokens,
    )


def run_mlx_lm(
    model, tokenizer, prompts: Sequence[Sequence[int]], gen_tokens: int, temperature: float = 0.0
) -> Run:
    """Every prompt through mlx-lm's `batch_generate`, all in one completion batch, with its
    sampler at `temperature` (argmax at 0)."""
    start = time.perf_counter()
    response = batch_generate(
        model,
        tokenizer,
        [list(prompt) for prompt in prompts],
        max_tokens=gen_tokens,
        completion_batch_size=len(prompts),
        prefill_batch_size=min(len(prompts), 8),
        sampler=make_sampler(temp=temperature),
    )
    seconds = time.perf_counter() - start
    return Run(response.stats.generation_tps, response.stats.generation_tokens / seconds)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an mlx-lm / Hugging Face safetensors folder")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--skip-mlx-lm", action="store_true")
    parser.add_argument(
        "--gather-attention",
        action="store_true",
        help="decode gathers each row's KV, then attends (no paged decode kernel)",
    )
    parser.add_argument("-ctk", "--cache-type-k", default="auto", help="mlxcel's KV key storage")
    parser.add_argument("-ctv", "--cache-type-v", default="auto", help="mlxcel's KV value storage")
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",")]

    results: dict[tuple[str, int], Run] = {}
    loaded = load_model(args.model)
    vocab_size = loaded.tokenizer.vocab_size
    # The first run of each implementation compiles kernels; it is not reported.
    settings = {
        "paged_decode_kernel": not args.gather_attention,
        "cache_type_k": args.cache_type_k,
        "cache_type_v": args.cache_type_v,
    }
    run_mlxcel(loaded, random_prompts(2, args.prompt_tokens, vocab_size), 8, **settings)
    for level in levels:
        prompts = random_prompts(level, args.prompt_tokens, vocab_size, seed=level)
        results["mlxcel", level] = run_mlxcel(
            loaded, prompts, args.gen_tokens, args.temperature, **settings
        )
        print(f"mlxcel N={level}: {results['mlxcel', level]}", flush=True)
    del loaded
    gc.collect()
    mx.clear_cache()

    if not args.skip_mlx_lm:
        model, tokenizer = mlx_lm_load(args.model)
        run_mlx_lm(model, tokenizer, random_prompts(2, args.prompt_tokens, vocab_size), 8)
        for level in levels:
            prompts = random_prompts(level, args.prompt_tokens, vocab_size, seed=level)
            results["mlx-lm", level] = run_mlx_lm(
                model, tokenizer, prompts, args.gen_tokens, args.temperature
            )
            print(f"mlx-lm N={level}: {results['mlx-lm', level]}", flush=True)

    print(
        "| N | mlxcel decode tok/s | mlx-lm decode tok/s | ratio | mlxcel total tok/s |"
        " mlx-lm total tok/s | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for level in levels:
        ours = results["mlxcel", level]
        theirs = results.get(("mlx-lm", level))
        if theirs is None:
            print(f"| {level} | {ours.decode_tps:,.1f} | | | {ours.total_tps:,.1f} | | |")
            continue
        print(
            f"| {level} | {ours.decode_tps:,.1f} | {theirs.decode_tps:,.1f} | "
            f"{ours.decode_tps / theirs.decode_tps:.2f}x | {ours.total_tps:,.1f} | "
            f"{theirs.total_tps:,.1f} | {ours.total_tps / theirs.total_tps:.2f}x |"
        )


if __name__ == "__main__":
    main()
