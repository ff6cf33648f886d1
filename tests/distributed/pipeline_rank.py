"""One rank of a pipeline-parallel run of the float32 SmolLM2, or the one-process reference.

Started by tests/distributed/test_pipeline_ranks.py (MLX_RANK and MLX_HOSTFILE set for the
ring backend), or with --reference as a single process running the unsplit model. Runs
greedy generation on real prompts and, on rank 0 (or the reference), writes every step's
logits and tokens to OUTPUT (.npz). Every rank writes its layer range, its resident memory
before and after building its stage, and how many layers it caches to OUTPUT's folder as
rank-RANK.json.

    python pipeline_rank.py OUTPUT --cache dense|paged [--reference] [--decode-steps N]

- dense: one prompt, prefilled in two chunks (the first with logits for every position),
  then N decode steps, over the stage's DenseKVCache caches.
- paged: two prompts of different lengths through `ModelRunner` over `PagedKVStorage` sized
  by `profile_model`: both prefills in one step (two passes), then N batched decode steps.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.engine.runner import ModelRunner, RowInput
from mlxcel_core.language_model import LanguageModel
from mlxcel_distributed.pipeline_stage import make_pipeline_stage
from mlxcel_models.default_model import default_model_path
from mlxcel_models.loading.loader import load_model

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Name three colours of the rainbow.",
)
BLOCK_SIZE = 16


def next_tokens(group: mx.distributed.Group | None, logits: mx.array) -> list[int]:
    """Rank 0's greedy tokens, (B, V) logits → B ids, agreed on by every rank.

    Only rank 0 holds real logits; it broadcasts its picks with an all-sum, as the engine's
    rank 0 would send them with the next step's rows.
    """
    picks = mx.argmax(logits, axis=-1).astype(mx.int32)
    if group is None:
        return picks.tolist()
    if group.rank() != 0:
        picks = mx.zeros_like(picks)
    return mx.distributed.all_sum(picks, group=group).tolist()


def run_dense(
    model: LanguageModel, group: mx.distributed.Group | None, prompt: list[int], num_steps: int
) -> dict[str, np.ndarray]:
    cache = model.make_cache()
    split = len(prompt) // 2
    first = model(mx.array([prompt[:split]]), cache)
    last = model(mx.array([prompt[split:]]), cache, last_only=True)
    mx.eval(first, last)
    step_logits = [last[:, -1]]
    tokens = [next_tokens(group, last[:, -1])]
    for _ in range(num_steps):
        logits = model(mx.array([tokens[-1]]), cache, last_only=True)[:, -1]
        step_logits.append(logits)
        tokens.append(next_tokens(group, logits))
    return {
        "prefill_logits": np.array(first),
        "step_logits": np.stack([np.array(x) for x in step_logits]),
        "tokens": np.array(tokens),
    }


def run_paged(
    model: LanguageModel,
    group: mx.distributed.Group | None,
    prompts: list[list[int]],
    num_steps: int,
) -> dict[str, np.ndarray]:
    profile = profile_model(model, max(map(len, prompts)))
    blocks_per_row = -(-(max(map(len, prompts)) + num_steps + 1) // BLOCK_SIZE)
    storage = PagedKVStorage(profile.layers, BLOCK_SIZE, 1 + blocks_per_row * len(prompts))
    storage.ensure_capacity(storage.max_blocks[0])
    runner = ModelRunner(model, storage)
    tables = [
        list(range(1 + row * blocks_per_row, 1 + (row + 1) * blocks_per_row))
        for row in range(len(prompts))
    ]
    step = runner.run([RowInput(p, (tables[i],), 0) for i, p in enumerate(prompts)])
    logits = step.last(range(len(prompts)))
    mx.eval(logits, storage.arrays())
    offsets = [len(p) for p in prompts]
    step_logits = [logits]
    tokens = [next_tokens(group, logits)]
    for _ in range(num_steps):
        rows = [RowInput([t], (tables[i],), offsets[i]) for i, t in enumerate(tokens[-1])]
        logits = runner.run(rows).last(range(len(rows)))
        mx.eval(logits, storage.arrays())
        offsets = [offset + 1 for offset in offsets]
        step_logits.append(logits)
        tokens.append(next_tokens(group, logits))
    return {
        "num_profiled_layers": np.array(len(profile.layers)),
        "step_logits": np.stack([np.array(x) for x in step_logits]),
        "tokens": np.array(tokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output", type=Path)
    parser.add_argument("--cache", choices=("dense", "paged"), required=True)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--decode-steps", type=int, default=6)
    args = parser.parse_args()
    group = None if args.reference else mx.distributed.init(backend="ring", strict=True)
    loaded = load_model(default_model_path())
    prompts = [
        loaded.tokenizer.encode_chat([{"role": "user", "content": text}]) for text in PROMPTS
    ]
    memory_before = mx.get_active_memory()
    model: LanguageModel = loaded.model
    rank, layers = 0, range(loaded.config.num_layers)
    if group is not None:
        stage = make_pipeline_stage(loaded.model, group)
        rank, layers, model = group.rank(), stage.layers, stage
        gc.collect()
    facts = {
        "layers": [layers.start, layers.stop],
        "memory_before": memory_before,
        "memory_after": mx.get_active_memory(),
        "num_caches": len(model.make_cache()),
    }
    if args.cache == "dense":
        result = run_dense(model, group, prompts[0], args.decode_steps)
    else:
        result = run_paged(model, group, prompts, args.decode_steps)
        facts["num_profiled_layers"] = int(result.pop("num_profiled_layers"))
    (args.output.parent / f"rank-{rank}.json").write_text(json.dumps(facts))
    if rank == 0:
        np.savez(args.output, **result)


if __name__ == "__main__":
    main()
