"""Speculative decoding's speed-up: the engine with a draft model against plain decoding.

The model and its draft (for issue 9: the 8B shape and its own 4-bit copy, which
`random_model.py --bits 4` writes from the same seed) are loaded once; then at each
concurrency N the same N random prompts run through the continuous-batching engine without
and with the draft model, greedy with no stop token, and the decode tok/s of the two (as
`batched_decode.py` counts them) are compared. The draft model drafts `--draft-max` tokens
per step; `--draft-p-min` 0 (the default here) keeps it from stopping early, since a
random-weight model gives no token a high probability.

    python benchmarks/spec_decode.py /tmp/l8b /tmp/l8b4 --concurrency 1 --draft-max 4
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from batched_decode import random_prompts, run_mlxcel

from mlxcel_core.speculative import SpeculativeConfig
from mlxcel_models.loading.loader import load_model


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an mlx-lm / Hugging Face safetensors folder")
    parser.add_argument("draft", help="the draft model's folder (same vocabulary)")
    parser.add_argument("--concurrency", default="1")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--draft-max", type=int, default=4, help="draft tokens per step")
    parser.add_argument("--draft-p-min", type=float, default=0.0)
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",")]

    loaded = load_model(args.model)
    draft = load_model(args.draft)
    vocab_size = loaded.tokenizer.vocab_size
    speculative = SpeculativeConfig(num_draft_tokens=args.draft_max, draft_p_min=args.draft_p_min)
    # The first run of each setting compiles kernels; it is not reported.
    warm_up = random_prompts(2, args.prompt_tokens, vocab_size)
    run_mlxcel(loaded, warm_up, 8)
    run_mlxcel(loaded, warm_up, 8, draft=draft, speculative=speculative)

    print(
        f"| N | plain decode tok/s | speculative decode tok/s (draft-max {args.draft_max}) |"
        " speed-up | drafts accepted |"
    )
    print("|---|---|---|---|---|")
    for level in levels:
        prompts = random_prompts(level, args.prompt_tokens, vocab_size, seed=level)
        plain = run_mlxcel(loaded, prompts, args.gen_tokens)
        drafted = run_mlxcel(loaded, prompts, args.gen_tokens, draft=draft, speculative=speculative)
        print(
            f"| {level} | {plain.decode_tps:,.1f} | {drafted.decode_tps:,.1f} | "
            f"{drafted.decode_tps / plain.decode_tps:.2f}x | "
            f"{drafted.accepted_draft_tokens:,} of {drafted.draft_tokens:,} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
