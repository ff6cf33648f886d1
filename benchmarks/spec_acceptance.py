"""Speculative decoding on a real model: acceptance rate, tokens per step and speed.

Runs a fixed set of chat prompts greedily through the engine, once without a drafter and
once per drafter, and prints, per drafter: draft tokens verified and accepted, the mean
tokens emitted per verify step, decode tokens/s against no drafter in the same run, and
whether every reply is token-identical to the plain one (it must be, at temperature 0).

    uv run python benchmarks/spec_acceptance.py                 # the embedded SmolLM2
    uv run python benchmarks/spec_acceptance.py --draft-layers 8 16 --draft-max 4
    uv run python benchmarks/spec_acceptance.py -m model.gguf --draft draft.gguf

Drafters: the model itself (an upper bound on acceptance), its first N layers
(`--draft-layers`, cut in memory), a draft model file (`--draft`) and prompt lookup.
Random-weight models cannot measure acceptance (DESIGN.md): use real weights.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_core.engine import Engine, EngineConfig, EngineRequest, OutputQueue, SchedulerConfig
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.speculative import SpeculativeConfig, SpeculativeMethod
from mlxcel_models.default_model import default_model_path
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.loading.loader import load_model

PROMPTS = (
    "Write a short story about a lighthouse keeper and a storm.",
    "Explain how a bicycle gear system works, step by step.",
    "Repeat this sentence three times: The quick brown fox jumps over the lazy dog.",
    "Write a Python function that checks whether a string is a palindrome, with tests.",
)
TIMEOUT_SECONDS = 900.0


@dataclass(frozen=True)
class Result:
    replies: list[list[int]]
    generated: int
    decode_seconds: float
    verified: int
    accepted: int

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.decode_seconds if self.decode_seconds else 0.0


def run(
    loaded: LoadedModel,
    prompts: Sequence[list[int]],
    max_tokens: int,
    speculative: SpeculativeConfig | None,
    draft: LanguageModel | None,
) -> Result:
    """Each prompt alone (batch 1), greedy; the totals over the prompts."""
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=1),
        context_size=2048,
        num_kv_blocks=256,
        speculative=speculative,
    )
    engine = Engine(loaded.model, config, draft_model=draft)
    generation = GenerationConfig(
        context_size=2048, max_tokens=max_tokens, stop_token_ids=loaded.tokenizer.eos_token_ids
    )
    replies, generated, seconds, verified, accepted = [], 0, 0.0, 0, 0
    try:
        for ids in prompts:
            sink = OutputQueue()
            request = EngineRequest(
                prompt_ids=tuple(ids),
                sampling=SamplingParams(temperature=0.0),
                generation=generation,
                detokenizer=loaded.tokenizer.make_detokenizer(),
            )
            engine.submit([request], sink)
            tokens = []
            while (output := sink.get(timeout=TIMEOUT_SECONDS)).stats is None:
                if output.error is not None:
                    raise RuntimeError(f"generation failed: {output.error}")
                if output.token_id is not None:
                    tokens.append(output.token_id)
            stats = output.stats
            replies.append(tokens)
            generated += stats.generated_tokens - 1
            seconds += stats.decode_seconds
            verified += stats.draft_tokens
            accepted += stats.accepted_draft_tokens
    finally:
        engine.shutdown()
    return Result(replies, generated, seconds, verified, accepted)


def truncated(path: str, num_layers: int) -> LanguageModel:
    """The model at `path` cut to its first `num_layers` decoder layers, in memory."""
    model = load_model(path).model
    model.module.model.layers = model.module.model.layers[:num_layers]
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=None, help="model (default: embedded)")
    parser.add_argument("--draft", action="append", default=[], help="draft model file/folder")
    parser.add_argument("--draft-layers", type=int, nargs="*", default=[8, 16])
    parser.add_argument("--draft-max", type=int, default=4)
    parser.add_argument("--draft-p-min", type=float, default=0.0)
    parser.add_argument("--prompt-lookup-max", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    path = args.model or str(default_model_path())
    loaded = load_model(path)
    prompts = [loaded.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]

    def config(method: SpeculativeMethod) -> SpeculativeConfig:
        return SpeculativeConfig(
            method=method,
            num_draft_tokens=args.draft_max,
            draft_p_min=args.draft_p_min,
            prompt_lookup_max=max(args.prompt_lookup_max, 1),
        )

    drafters: list[tuple[str, SpeculativeConfig, LanguageModel | None]] = [
        ("the model itself", config(SpeculativeMethod.DRAFT_MODEL), load_model(path).model),
        *(
            (f"its first {n} layers", config(SpeculativeMethod.DRAFT_MODEL), truncated(path, n))
            for n in args.draft_layers
        ),
        *((d, config(SpeculativeMethod.DRAFT_MODEL), load_model(d).model) for d in args.draft),
    ]
    if args.prompt_lookup_max > 0:
        drafters.append(
            (f"prompt lookup (n <= {args.prompt_lookup_max})",
             config(SpeculativeMethod.PROMPT_LOOKUP), None)
        )  # fmt: skip
    start = time.perf_counter()
    plain = run(loaded, prompts, args.max_tokens, None, None)
    print(
        f"{len(prompts)} prompts, up to {args.max_tokens} tokens each, greedy, batch 1; "
        f"--draft-max {args.draft_max} --draft-p-min {args.draft_p_min}"
    )
    print(f"no drafter: {plain.generated} decode tokens, {plain.tokens_per_second:.2f} tokens/s")
    print("| drafter | verified | accepted | rate | tokens/step | tokens/s | vs plain | same |")
    print("|---|---|---|---|---|---|---|---|")
    for name, speculative, draft in drafters:
        result = run(loaded, prompts, args.max_tokens, speculative, draft)
        steps = result.generated - result.accepted
        rate = result.accepted / result.verified if result.verified else 0.0
        print(
            f"| {name} | {result.verified} | {result.accepted} | {rate:.1%} | "
            f"{result.generated / steps:.2f} | {result.tokens_per_second:.2f} | "
            f"{result.tokens_per_second / plain.tokens_per_second:.2f}x | "
            f"{'yes' if result.replies == plain.replies else 'NO'} |"
        )
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
