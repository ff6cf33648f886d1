"""`mlxcel generate --prompts-file FILE`: many prompts at once on the continuous-batching engine.

Each non-blank line of the file is one prompt, numbered from 0 in the file's order (its
`index`). The replies are written to stdout as JSON lines in that order (a reasoning
model's reasoning left out of `text`, and given as `reasoning` with `--show-reasoning`);
throughput goes to stderr. A prompt that cannot run (empty once encoded, or not fitting the
context) gets an error row (`index`, `prompt`, `error`) in its place while the others are
generated, and the command then exits 1.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import TextIO

from mlxcel.common.engine_flags import open_engine, print_setup
from mlxcel.common.flags import RunError
from mlxcel.generation.engine_outputs import next_output
from mlxcel.generation.reply_reasoning import ReplyReasoning
from mlxcel_core.engine import (
    EngineConfig,
    EngineOutput,
    EngineRequest,
    OutputQueue,
    RunnerFactory,
)
from mlxcel_core.errors import InputError
from mlxcel_core.request import GenerationConfig
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

    Returns:
        0, or 1 when a prompt could not run (its row holds the error).

    Raises:
        RunError: the KV cache cannot hold one sequence of the context size, or a reply
            failed.
        UsageError: a KV cache type cannot store this model's head dim, or the draft model
            does not fit the model.
    """
    tokenizer = loaded.tokenizer
    context_size = args.ctx_size or loaded.config.context_length
    engine_config = replace(engine_config, context_size=context_size)
    refused = {
        index: problem
        for index, ids in enumerate(token_ids)
        if (problem := _prompt_problem(ids, context_size)) is not None
    }
    config = GenerationConfig(
        context_size=context_size,
        max_tokens=args.n_predict,
        stop_token_ids=tokenizer.eos_token_ids,
    )
    breakers = tokenizer.token_ids_containing(params.dry_sequence_breakers)
    start = time.perf_counter()
    requests = [
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
        if index not in refused
    ]
    rows = {index: _error_row(index, prompts[index], problem) for index, problem in refused.items()}
    writer = _RowWriter(len(prompts), out)
    if requests:
        engine = open_engine(
            args,
            loaded,
            engine_config,
            context_size=context_size,
            err=err,
            make_runner=make_runner,
        )
        try:
            sink = OutputQueue()
            engine.submit(requests, sink)
            replies = _collect(sink, prompts, reasoning, args.show_reasoning, rows, writer)
        finally:
            engine.shutdown()
    else:
        replies = []
        writer.write(rows)
    seconds = time.perf_counter() - start
    _print_throughput(replies, token_ids, seconds, err)
    print_setup(loaded, engine_config, err)
    if refused:
        first = min(refused)
        print(
            f"mlxcel: error: {len(refused)} of {len(prompts)} prompts not generated "
            f"(error rows); prompt {first}: {refused[first]}",
            file=err,
        )
        return 1
    return 0


def _prompt_problem(ids: list[int], context_size: int) -> str | None:
    """Why a prompt of token `ids` cannot run in `context_size` tokens; None if it can."""
    if not ids:
        return "the prompt is empty: it encodes to no tokens"
    if len(ids) >= context_size:
        return (
            f"the prompt has {len(ids)} tokens but the context size is {context_size}; "
            "shorten it or raise -c/--ctx-size"
        )
    return None


def _error_row(index: int, prompt: str, problem: str) -> dict:
    return {"index": index, "prompt": prompt, "error": problem}


def _print_throughput(
    replies: list[dict], token_ids: list[list[int]], seconds: float, err: TextIO
) -> None:
    generated = sum(reply["completion_tokens"] for reply in replies)
    cached = sum(reply["cached_tokens"] for reply in replies)
    prompt_tokens = sum(len(token_ids[reply["index"]]) for reply in replies)
    print(
        f"{len(replies)} prompts: {prompt_tokens} prompt tokens ({cached} from the "
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


class _RowWriter:
    """Writes rows as JSON lines in index order, each once those before it are written."""

    def __init__(self, num_rows: int, out: TextIO) -> None:
        self.num_rows = num_rows
        self.written = 0
        self._out = out

    @property
    def done(self) -> bool:
        return self.written == self.num_rows

    def write(self, rows: dict[int, dict]) -> None:
        while self.written in rows:
            self._out.write(json.dumps(rows[self.written], ensure_ascii=False) + "\n")
            self._out.flush()
            self.written += 1


def _collect(
    sink: OutputQueue,
    prompts: list[str],
    reasoning: list[ReplyReasoning],
    show_reasoning: bool,
    rows: dict[int, dict],
    writer: _RowWriter,
) -> list[dict]:
    """Collect every submitted prompt's reply into `rows` (which already hold the error
    rows) and write each row once those before it are written; a reasoning model's
    reasoning is left out of `text`, and written as `reasoning` when `show_reasoning` is
    set. Returns the replies, in index order.

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
    writer.write(rows)
    while not writer.done:
        output: EngineOutput = next_output(sink)
        if output.error is not None:
            raise RunError(f"prompt {output.index} failed: {output.error}")
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
            replies[output.index] = rows[output.index] = {
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
            writer.write(rows)
    return [replies[index] for index in sorted(replies)]
