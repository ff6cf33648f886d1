"""`mlxcel generate --prompts-file FILE`: many prompts at once on the continuous-batching engine.

Each non-blank line of the file is one prompt. The replies are written to stdout as JSON
lines in the file's order (a reasoning model's reasoning left out of `text`, and given as
`reasoning` with `--show-reasoning`); throughput goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TextIO

from mlxcel.engine_flags import open_engine
from mlxcel.engine_outputs import next_output
from mlxcel.flags import InputError, RunError
from mlxcel.reply_reasoning import ReplyReasoning
from mlxcel_core.engine import (
    EngineConfig,
    EngineOutput,
    EngineRequest,
    OutputQueue,
    RunnerFactory,
)
from mlxcel_core.generate import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.loaded import LoadedModel


def read_prompts(text: str, path: str) -> list[str]:
    """The file's non-blank lines.

    Raises:
        InputError: the file holds no prompt.
    """
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise InputError(f"the prompts file {path} holds no prompt (one per line)")
    return prompts


def run_batch(
    args: argparse.Namespace,
    loaded: LoadedModel,
    engine_config: EngineConfig,
    prompts: list[str],
    token_ids: list[list[int]],
    reasoning: list[ReplyReasoning],
    params: SamplingParams,
    out: TextIO,
    err: TextIO,
    *,
    make_runner: RunnerFactory | None = None,
) -> int:
    """Generate every prompt's reply together; write one JSON line per prompt, in order.

    `reasoning` gives each prompt's reasoning settings: its budget, and the markers that
    keep the reasoning out of its text (written apart with `--show-reasoning`).
    `make_runner` builds the engine's model runner (`--tp`'s lockstep runner).

    Raises:
        InputError: a prompt does not fit the context.
        RunError: the KV cache cannot hold one sequence of the context size.
        UsageError: a KV cache type cannot store this model's head dim, or the draft model
            does not fit the model.
    """
    tokenizer = loaded.tokenizer
    context_size = args.ctx_size or loaded.config.context_length
    for line, ids in enumerate(token_ids, start=1):
        if len(ids) >= context_size:
            raise InputError(
                f"prompt {line} has {len(ids)} tokens but the context size is {context_size}"
            )
    config = GenerationConfig(
        context_size=context_size,
        max_tokens=args.n_predict,
        stop_token_ids=tokenizer.eos_token_ids,
    )
    breakers = tokenizer.token_ids_containing(params.dry_sequence_breakers)
    start = time.perf_counter()
    engine = open_engine(
        args, loaded, engine_config, context_size=context_size, make_runner=make_runner
    )
    try:
        sink = OutputQueue()
        engine.submit(
            [
                EngineRequest(
                    prompt_ids=tuple(ids),
                    sampling=params,
                    generation=config,
                    detokenizer=reasoning[index].make_detokenizer(tokenizer),
                    dry_breaker_ids=breakers,
                    index=index,
                    constraint=reasoning[index].make_constraint(),
                )
                for index, ids in enumerate(token_ids)
            ],
            sink,
        )
        replies = _write_in_order(sink, prompts, reasoning, args.show_reasoning, out)
    finally:
        engine.shutdown()
    seconds = time.perf_counter() - start
    generated = sum(reply["completion_tokens"] for reply in replies)
    cached = sum(reply["cached_tokens"] for reply in replies)
    print(
        f"{len(prompts)} prompts: {sum(map(len, token_ids))} prompt tokens ({cached} from the "
        f"prefix cache), {generated} generated in {seconds:.2f} s "
        f"({generated / seconds:.1f} tokens/s overall)",
        file=err,
    )
    drafted = sum(reply["draft_tokens"] for reply in replies)
    if drafted:
        accepted = sum(reply["accepted_draft_tokens"] for reply in replies)
        print(
            f"draft: {drafted} tokens verified, {accepted} accepted ({accepted / drafted:.1%})",
            file=err,
        )
    return 0


def _write_in_order(
    sink: OutputQueue,
    prompts: list[str],
    reasoning: list[ReplyReasoning],
    show_reasoning: bool,
    out: TextIO,
) -> list[dict]:
    """Collect every reply and write each as soon as those before it are written; a
    reasoning model's reasoning is left out of `text`, and written as `reasoning` when
    `show_reasoning` is set.

    Raises:
        RunError: a reply failed.
    """
    texts: dict[int, list[str]] = {index: [] for index in range(len(prompts))}
    thoughts: dict[int, list[str]] = {index: [] for index in range(len(prompts))}
    splitters = {
        index: splitter
        for index, each in enumerate(reasoning)
        if (splitter := each.make_splitter()) is not None
    }
    replies: dict[int, dict] = {}
    written = 0
    while written < len(prompts):
        output: EngineOutput = next_output(sink)
        if output.error is not None:
            raise RunError(f"prompt {output.index + 1} failed: {output.error}")
        splitter = splitters.get(output.index)
        if splitter is None:
            texts[output.index].append(output.text)
        else:
            deltas = [splitter.feed(output.text)]
            if output.finished:
                deltas.append(splitter.finish())
            for delta in deltas:
                thoughts[output.index].append(delta.reasoning)
                texts[output.index].append(delta.content)
        if output.finish_reason is not None and output.stats is not None:
            replies[output.index] = {
                "index": output.index,
                "prompt": prompts[output.index],
                "text": "".join(texts[output.index]),
                **(
                    {"reasoning": "".join(thoughts[output.index])}
                    if splitter is not None and show_reasoning
                    else {}
                ),
                "finish_reason": output.finish_reason.value,
                "prompt_tokens": output.stats.prompt_tokens,
                "cached_tokens": output.stats.cached_tokens,
                "completion_tokens": output.stats.generated_tokens,
                "draft_tokens": output.stats.draft_tokens,
                "accepted_draft_tokens": output.stats.accepted_draft_tokens,
            }
        while written in replies:
            out.write(json.dumps(replies[written], ensure_ascii=False) + "\n")
            out.flush()
            written += 1
    return [replies[index] for index in range(len(prompts))]
