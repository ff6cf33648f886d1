"""Every row of the GPU decode-speed targets (issue 28), mlxcel against mlx-lm 0.32.2 on the
same card in the same process, in one table.

Random-weight Llama-3.2-1B and Llama-3.1-8B shapes (bf16, and the 8B shape's 4-bit copy,
group size 64) are drawn on the device (`target_models.py`), and both implementations run
the very same weight arrays: mlx-lm's module as mlx-lm runs it, a twin module with mlxcel's
compute options through mlxcel's continuous-batching `Engine`, as the server runs it.

- decode, batch 1: one request (128-token prompt, greedy, no stop token) through the
  engine against mlx-lm's `generate_step`; tokens/s after the first token.
- batched decode: 64 requests at once through the engine against mlx-lm's
  `batch_generate` with one completion batch of 64 (`batched_decode.py`).
- prefill: one 4,096-token prompt; tokens/s up to the first token. The engine prefills in
  chunks of `--prefill-chunk` tokens (2,048, mlx-lm's `prefill_step_size`); one engine
  serves the warm-up and every timed run, as a server's does.
- turbo4: the engine decoding after 8,192 positions with turbo4 keys and values, against
  the same engine with f16 keys and values.
- speculative: one verification pass of k + 1 = 5 tokens of one row through the 8B shape
  against one plain decode pass, both through the engine's model runner
  (`device_measures.pass_seconds`), and the speed-up these costs imply with the 1B shape
  drafting k = 4 tokens at acceptance rates 0.6 and 0.8: expected tokens per step
  (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023, "Fast Inference from Transformers via
  Speculative Decoding") over k draft passes and one verification, against one plain pass
  per token. Random weights cannot measure acceptance (DESIGN.md).

The roofline share is the bytes a decode step reads (the weights, less an untied embedding
table, plus every row's keys and values at the mean context) per second, over the
device-to-device copy bandwidth measured at the start (bytes read plus written). Each row
is written to `--out` (markdown) and beside it as JSON as soon as it is measured, so a run
cut short keeps what it measured.

    python benchmarks/gpu_targets.py --out /tmp/targets.md          # on a CUDA GPU
    python benchmarks/gpu_targets.py --tiny --out /tmp/targets.md   # tiny shapes, any device
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
from batched_decode import mlxcel_engine, random_prompts, run_mlx_lm, run_mlxcel, run_requests
from device_measures import copy_bandwidth, pass_seconds
from mlx_lm.generate import generate_step
from target_models import ModelShelf, TargetModel
from target_report import Report, TargetRow

from mlxcel.tuning.bench_command import time_run
from mlxcel_core.kernels.paged_attention.grid import MIN_PARTITION_TOKENS

DRAFT_TOKENS = 4
ACCEPTANCE_RATES = (0.6, 0.8)
# Positions from which a decode step splits each row over two partitions or more.
SPLIT_KV_CONTEXT = 2 * MIN_PARTITION_TOKENS + 64


@dataclass(frozen=True)
class Scale:
    """How much each row runs."""

    small: str = "llama-3.2-1b"
    large: str = "llama-3.1-8b"
    prompt_tokens: int = 128
    gen_tokens: int = 128
    batch_rows: int = 64
    batch_gen_tokens: int = 128
    prefill_tokens: int = 4096
    turbo_context: int = 8192
    turbo_gen_tokens: int = 128
    repetitions: int = 3
    verify_passes: int = 20
    copy_bytes: int = 2 * 2**30


FULL = Scale()
QUICK = replace(FULL, gen_tokens=64, batch_gen_tokens=64, turbo_gen_tokens=64, repetitions=1)
TINY = Scale(
    small="tiny",
    large="tiny",
    prompt_tokens=16,
    gen_tokens=6,
    batch_rows=4,
    batch_gen_tokens=6,
    prefill_tokens=64,
    turbo_context=64,
    turbo_gen_tokens=6,
    repetitions=1,
    verify_passes=2,
    copy_bytes=2**20,
)


def greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def mlx_lm_speeds(model: TargetModel, prompt: list[int], gen_tokens: int) -> tuple[float, float]:
    """mlx-lm's (prefill, decode) tokens/s for one prompt through `generate_step`."""

    def stream(tokens: list[int]):
        steps = generate_step(
            mx.array(tokens), model.reference, max_tokens=gen_tokens, sampler=greedy
        )
        return (token for token, _ in steps)

    return time_run(stream, prompt, gen_tokens)


class Targets:
    """Measures the rows; `run(key)` measures one and adds it to the report."""

    def __init__(self, scale: Scale, report: Report, prefill_chunk: int) -> None:
        self.scale = scale
        self.report = report
        self.prefill_chunk = prefill_chunk
        self.shelf = ModelShelf(scale.small, scale.large)
        self.bandwidth = 0.0

    def share(self, model: TargetModel, rows: int, context: int, tokens_per_second: float):
        """Share of the copy bandwidth that reading a step's weights and KV takes."""
        step_bytes = model.decode_bytes + rows * context * model.kv_bytes_per_token
        return step_bytes * tokens_per_second / rows / self.bandwidth

    def repeated(self, measure: Callable[[], float]) -> float:
        return statistics.median(measure() for _ in range(self.scale.repetitions))

    def decode(self, key: str, target: float, roofline: float | None) -> TargetRow:
        model = self.shelf.get(key)
        s = self.scale
        prompt = random_prompts(1, s.prompt_tokens, model.config["vocab_size"])[0]
        run_mlxcel(model.ours, [prompt[:8]], 4)
        mlx_lm_speeds(model, prompt[:8], 4)
        ours = self.repeated(lambda: run_mlxcel(model.ours, [prompt], s.gen_tokens).decode_tps)
        theirs = self.repeated(lambda: mlx_lm_speeds(model, prompt, s.gen_tokens)[1])
        share = self.share(model, 1, s.prompt_tokens + s.gen_tokens // 2, ours)
        return TargetRow.ratio_row(
            f"decode, batch 1, {model.name}", ours, theirs, "tok/s", "mlx-lm generate_step",
            target=target, share=share, min_share=roofline,
        )  # fmt: skip

    def batched(self, key: str, target: float) -> TargetRow:
        model = self.shelf.get(key)
        s = self.scale
        vocab = model.config["vocab_size"]
        warm_up = random_prompts(2, s.prompt_tokens, vocab)
        run_mlxcel(model.ours, warm_up, 4)
        run_mlx_lm(model.reference, model.reference_tokenizer, warm_up, 4)
        prompts = random_prompts(s.batch_rows, s.prompt_tokens, vocab, seed=s.batch_rows)
        ours = run_mlxcel(model.ours, prompts, s.batch_gen_tokens).decode_tps
        theirs = run_mlx_lm(
            model.reference, model.reference_tokenizer, prompts, s.batch_gen_tokens
        ).decode_tps
        context = s.prompt_tokens + s.batch_gen_tokens // 2
        return TargetRow.ratio_row(
            f"batched decode, {s.batch_rows} rows, {model.name}", ours, theirs, "tok/s",
            "mlx-lm batch_generate", target=target,
            share=self.share(model, s.batch_rows, context, ours),
        )  # fmt: skip

    def prefill(self) -> TargetRow:
        model = self.shelf.get("8b")
        length = self.scale.prefill_tokens
        prompt = random_prompts(1, length, model.config["vocab_size"])[0]
        chunk = self.prefill_chunk
        # One engine for every run, as a server keeps one: its thread keeps the attention
        # plans CUDA builds per shape, which a new engine's thread would build again.
        engine = mlxcel_engine(model.ours, 1, length + 2, max_prefill_chunk=chunk)

        # With one generated token the run ends at the first token: its rate is 1 / TTFT.
        def ours() -> float:
            return length * run_requests(engine, model.ours, [prompt], 1).total_tps

        def theirs() -> float:
            return mlx_lm_speeds(model, prompt, 1)[0]

        try:
            first = ours()
            theirs()
            return TargetRow.ratio_row(
                f"prefill {length:,} tokens, {model.name}", self.repeated(ours),
                self.repeated(theirs), "tok/s", "mlx-lm generate_step", target=1.3,
                note=f"engine prefill chunks of {chunk} tokens; the engine's first run "
                f"{first:,.0f} tok/s",
            )  # fmt: skip
        finally:
            engine.shutdown()

    def turbo4(self) -> TargetRow:
        model = self.shelf.get("1b")
        s = self.scale
        prompt = random_prompts(1, s.turbo_context, model.config["vocab_size"])[0]
        # The warm-up's context takes the split-KV decode kernels, as the measured one
        # does: a short one takes the one-pass kernel, and NVRTC would compile the split
        # and merge kernels inside the measured decode (seconds on a fresh machine).
        warm_up = prompt[: min(len(prompt), SPLIT_KV_CONTEXT)]
        speeds = {}
        for cache_type in ("turbo4", "f16"):
            types = {"cache_type_k": cache_type, "cache_type_v": cache_type}
            run_mlxcel(model.ours, [warm_up], 4, **types)
            speeds[cache_type] = self.repeated(
                lambda types=types: (
                    run_mlxcel(model.ours, [prompt], s.turbo_gen_tokens, **types).decode_tps
                )
            )
        return TargetRow.ratio_row(
            f"turbo4 K and V at {s.turbo_context:,} context, {model.name}, batch 1",
            speeds["turbo4"], speeds["f16"], "tok/s", "mlxcel, f16 K and V", target=0.9,
        )  # fmt: skip

    def speculative(self) -> list[TargetRow]:
        target, draft = self.shelf.get("8b"), self.shelf.get("1b")
        s = self.scale
        context = s.prompt_tokens

        def cost(model: TargetModel, tokens: int) -> float:
            return pass_seconds(
                model.ours.model, tokens_per_row=tokens, context=context, passes=s.verify_passes
            )

        plain, verify, drafting = cost(target, 1), cost(target, DRAFT_TOKENS + 1), cost(draft, 1)
        step = DRAFT_TOKENS * drafting + verify
        speedups = {
            rate: (1 - rate ** (DRAFT_TOKENS + 1)) / (1 - rate) * plain / step
            for rate in ACCEPTANCE_RATES
        }
        costs = (
            f"{draft.name} draft pass {drafting * 1e3:.2f} ms, verification "
            f"{verify * 1e3:.2f} ms, plain pass {plain * 1e3:.2f} ms, k = {DRAFT_TOKENS}"
        )
        return [
            TargetRow.cost_row(
                f"speculative: verification of {DRAFT_TOKENS + 1} tokens, {target.name}, "
                "batch 1", verify * 1e3, plain * 1e3, "ms", "one plain decode pass",
                most=1.3,
            ),
            TargetRow.ratio_row(
                f"speculative: implied speed-up at acceptance {ACCEPTANCE_RATES[-1]}",
                speedups[ACCEPTANCE_RATES[-1]], 1.0, "x", "plain decode", target=1.8,
                note=f"at {ACCEPTANCE_RATES[0]}: {speedups[ACCEPTANCE_RATES[0]]:.2f}x; {costs}",
            ),
        ]  # fmt: skip

    def run(self, key: str) -> None:
        rows = {
            "decode_1b": lambda: [self.decode("1b", 2.0, None)],
            "batch_1b": lambda: [self.batched("1b", 1.5)],
            "turbo4_1b": lambda: [self.turbo4()],
            "decode_8b": lambda: [self.decode("8b", 1.4, 0.65)],
            "batch_8b": lambda: [self.batched("8b", 1.5)],
            "prefill_8b": lambda: [self.prefill()],
            "speculative_8b": self.speculative,
            "decode_8b4": lambda: [self.decode("8b4", 2.5, 0.5)],
            "batch_8b4": lambda: [self.batched("8b4", 4.0)],
        }
        for row in rows[key]():
            self.report.add(key, row)


# Run order: each model's rows together; the 1B shape is dropped once the draft pass is
# timed, the bf16 8B once its 4-bit copy exists.
ROW_KEYS = (
    "decode_1b", "batch_1b", "turbo4_1b", "decode_8b", "batch_8b", "prefill_8b",
    "speculative_8b", "decode_8b4", "batch_8b4",
)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="markdown table (and .json)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="one repetition, 64 tokens")
    size.add_argument("--tiny", action="store_true", help="tiny shapes, for checking on CPU")
    parser.add_argument("--rows", default=",".join(ROW_KEYS), help="which rows, comma-separated")
    parser.add_argument("--prefill-chunk", type=int, default=2048)
    args = parser.parse_args(argv)
    keys = args.rows.split(",")
    unknown = sorted(set(keys) - set(ROW_KEYS))
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {', '.join(ROW_KEYS)}")
    scale = TINY if args.tiny else QUICK if args.quick else FULL

    report = Report(args.out, scale=scale)
    targets = Targets(scale, report, args.prefill_chunk)
    targets.bandwidth = copy_bandwidth(scale.copy_bytes, 10)
    report.set_bandwidth(targets.bandwidth)
    for key in (key for key in ROW_KEYS if key in keys):
        report.progress(f"measuring {key}")
        targets.run(key)
        if key == "speculative_8b" or (key == "turbo4_1b" and "speculative_8b" not in keys):
            targets.shelf.drop("1b")
        if key == "decode_8b4":
            targets.shelf.drop("8b")
    report.progress("done")
    print(report.markdown(), flush=True)


if __name__ == "__main__":
    main()
