"""`mlxcel generate`: one prompt in, streamed text out, timings on stderr.

Generation runs on the continuous-batching engine, so the KV cache, speculative decoding
and engine flags work as they do in `serve`. With `--prompts-file`, many prompts run
together (see `batch_generate`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from mlxcel.adapter_flags import ADAPTER_FLAGS, adapter_specs_from
from mlxcel.batch_generate import OUTPUT_TIMEOUT_SECONDS, read_prompts, run_batch
from mlxcel.engine_flags import ENGINE_FLAGS, engine_config_from, open_engine
from mlxcel.flags import (
    BATCH_SIZE_FLAG,
    CTX_SIZE_FLAG,
    MODEL_FLAG,
    SAMPLING_FLAGS,
    Flag,
    InputError,
    RunError,
    UsageError,
    add_command,
    pick_one,
    resolve_defaults,
    sampling_params_from,
)
from mlxcel.loading import load_for_command
from mlxcel.reasoning_display import ReasoningDisplay, stream_is_terminal
from mlxcel.reply_reasoning import ReplyReasoning, reply_reasoning
from mlxcel.speculative_flags import check_draft_model_path
from mlxcel_core.engine import EngineConfig, EngineRequest, OutputQueue
from mlxcel_core.generate import GenerationConfig, GenerationStats
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.tokenizer import resolve_chat_template
from mlxcel_models.tokenizer.reasoning import find_reasoning_syntax

PROMPT_FLAGS = (
    Flag(("-p", "--prompt"), "prompt", str, None, "the prompt"),
    Flag(("-f", "--file"), "file", str, None, "read the prompt from a file"),
    Flag(("--prompts-file",), "prompts_file", str, None,
         "one prompt per line, generated together (-np at once); JSON lines out"),
    Flag(("-n", "--n-predict"), "n_predict", int, -1,
         "tokens to generate; -1 = until the context is full", env="LLAMA_ARG_N_PREDICT"),
    Flag(("-sys", "--system-prompt"), "system_prompt", str, None,
         "system message for the chat template"),
    Flag(("--chat-template",), "chat_template", str, None,
         "a built-in template name or Jinja text (default: the model's own)",
         env="LLAMA_ARG_CHAT_TEMPLATE"),
    Flag(("--chat-template-file",), "chat_template_file", str, None,
         "read the Jinja chat template from a file", env="LLAMA_ARG_CHAT_TEMPLATE_FILE"),
    Flag(("-no-cnv", "--no-conversation"), "raw", bool, False,
         "raw completion: send the prompt as it is, without the chat template",
         is_switch=True),
)  # fmt: skip
REASONING_FLAGS = (
    Flag(("--show-reasoning",), "show_reasoning", bool, False,
         "print the model's reasoning (dimmed on a terminal) before its answer",
         env="MLXCEL_SHOW_REASONING", is_switch=True),
    Flag(("--reasoning-budget",), "reasoning_budget", int, -1,
         "most reasoning tokens, then the answer; -1 = no limit, 0 = no reasoning",
         env="LLAMA_ARG_THINK_BUDGET"),
)  # fmt: skip
FLAGS = (
    MODEL_FLAG,
    CTX_SIZE_FLAG,
    BATCH_SIZE_FLAG,
    *PROMPT_FLAGS,
    *REASONING_FLAGS,
    *ENGINE_FLAGS,
    *ADAPTER_FLAGS,
    *SAMPLING_FLAGS,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    add_command(subparsers, "generate", __doc__, FLAGS, run)


def _check_text(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InputError(f"the {what} is not valid UTF-8 text ({error.reason})") from error
    return text


def _read_text_file(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {what} {path}: {error}") from error


def _read_prompts(args: argparse.Namespace) -> list[str]:
    source = pick_one(
        args, ("prompt", "file", "prompts_file"), "the prompt with -p, -f or --prompts-file"
    )
    if source is None:
        raise UsageError("no prompt: give one with -p PROMPT, -f FILE or --prompts-file FILE")
    if source == "prompt":
        return [_check_text(args.prompt, "prompt")]
    if source == "prompts_file":
        text = _read_text_file(args.prompts_file, "prompts file")
        return read_prompts(text, args.prompts_file)
    prompt = _read_text_file(args.file, "prompt file")
    # As llama.cpp's -f: the newline that ends a file's last line is not part of the prompt.
    return [prompt.removesuffix("\n")]


def _chat_template(args: argparse.Namespace) -> str | None:
    source = pick_one(
        args, ("chat_template", "chat_template_file"), "--chat-template or --chat-template-file"
    )
    if source == "chat_template_file":
        return _read_text_file(args.chat_template_file, "chat template file")
    if source == "chat_template":
        try:
            return resolve_chat_template(args.chat_template)
        except ValueError as error:
            raise UsageError(str(error)) from error
    return None


def prompt_tokens(loaded: LoadedModel, args: argparse.Namespace, prompt: str) -> list[int]:
    """Token ids of the prompt: through the chat template unless raw mode is asked for.

    Raises:
        UsageError: chat mode is asked for but the model has no chat template.
    """
    tokenizer = loaded.tokenizer
    template = _chat_template(args)
    if args.raw:
        if args.system_prompt is not None:
            raise UsageError("-sys/--system-prompt needs the chat template: drop -no-cnv")
        return tokenizer.encode(prompt)
    if template is None and tokenizer.chat_template is None:
        raise UsageError(
            "the model has no chat template: pass --chat-template NAME or -no-cnv for raw text"
        )
    messages = [{"role": "user", "content": prompt}]
    if args.system_prompt is not None:
        system_prompt = _check_text(args.system_prompt, "system prompt")
        messages.insert(0, {"role": "system", "content": system_prompt})
    syntax = find_reasoning_syntax(tokenizer, template)
    # As llama-server does for a zero budget: the template's own switch, where it has one.
    kwargs = {"enable_thinking": False} if args.reasoning_budget == 0 else {}
    try:
        return tokenizer.encode_chat(
            messages,
            chat_template=template,
            template_kwargs=kwargs if syntax is not None and syntax.thinking_switch else None,
        )
    except ValueError as error:
        raise InputError(str(error)) from error


def format_stats(stats: GenerationStats, load_seconds: float) -> str:
    lines = [
        f"prompt: {stats.prompt_tokens} tokens, {stats.prompt_tokens_per_second:.1f} tokens/s"
        f" ({stats.prompt_seconds:.2f} s)",
        f"generated: {stats.generated_tokens} tokens, "
        f"{stats.decode_tokens_per_second:.1f} tokens/s ({stats.decode_seconds:.2f} s)",
    ]
    if stats.draft_tokens:
        rate = stats.accepted_draft_tokens / stats.draft_tokens
        lines.append(
            f"draft: {stats.draft_tokens} tokens verified, {stats.accepted_draft_tokens} "
            f"accepted ({rate:.1%})"
        )
    lines.append(
        f"peak memory: {stats.peak_memory_bytes / 2**20:.1f} MiB, load time: {load_seconds:.2f} s"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    resolve_defaults(args, FLAGS, environ)
    prompts = _read_prompts(args)
    params = sampling_params_from(args)
    if args.n_predict < -1:
        raise UsageError(f"-n/--n-predict must be -1 or >= 0, got {args.n_predict}")
    if args.ctx_size < 0:
        raise UsageError(f"-c/--ctx-size must be >= 0, got {args.ctx_size}")
    if args.batch_size < 1:
        raise UsageError(f"-b/--batch-size must be >= 1, got {args.batch_size}")
    if args.reasoning_budget < -1:
        raise UsageError(f"--reasoning-budget must be -1 or >= 0, got {args.reasoning_budget}")
    adapters = adapter_specs_from(args)
    # Engine and draft flags are checked before the model loads, not after.
    engine_config = engine_config_from(args, max_waiting=len(prompts))
    check_draft_model_path(args)
    loaded = load_for_command(args.model, adapters=adapters, fuse_adapters=args.lora_fuse)
    token_ids = [prompt_tokens(loaded, args, prompt) for prompt in prompts]
    for line, tokens in enumerate(token_ids, start=1):
        if not tokens:
            where = "" if args.prompts_file is None else f" on line {line}"
            raise InputError(f"the prompt{where} is empty: it encodes to no tokens")
    template = _chat_template(args)
    reasoning = [
        reply_reasoning(loaded.tokenizer, template, ids, args.reasoning_budget) for ids in token_ids
    ]
    if args.prompts_file is not None:
        return run_batch(
            args, loaded, engine_config, prompts, token_ids, reasoning, params, out, err
        )
    (tokens,) = token_ids
    return _generate_one(args, loaded, engine_config, tokens, reasoning[0], params, out, err)


def _generate_one(
    args: argparse.Namespace,
    loaded: LoadedModel,
    engine_config: EngineConfig,
    tokens: list[int],
    reasoning: ReplyReasoning,
    params: SamplingParams,
    out: TextIO,
    err: TextIO,
) -> int:
    """Stream one reply from the engine to `out`, its reasoning hidden unless
    `--show-reasoning`; timings to `err`.

    Raises:
        InputError: the prompt does not fit the context.
        RunError: generation failed.
    """
    tokenizer = loaded.tokenizer
    context_size = args.ctx_size or loaded.config.context_length
    if len(tokens) >= context_size:
        raise InputError(
            f"the prompt has {len(tokens)} tokens but the context size is {context_size}; "
            "shorten the prompt or raise -c/--ctx-size"
        )
    display = ReasoningDisplay(
        out,
        reasoning.markers,
        reasoning.phase,
        show=args.show_reasoning,
        dim=stream_is_terminal(out),
    )
    request = EngineRequest(
        prompt_ids=tuple(tokens),
        sampling=params,
        generation=GenerationConfig(
            context_size=context_size,
            max_tokens=args.n_predict,
            stop_token_ids=tokenizer.eos_token_ids,
        ),
        detokenizer=reasoning.make_detokenizer(tokenizer),
        dry_breaker_ids=tokenizer.token_ids_containing(params.dry_sequence_breakers),
        constraint=reasoning.make_constraint(),
    )
    engine = open_engine(args, loaded, engine_config, context_size=context_size)
    try:
        sink = OutputQueue()
        engine.submit([request], sink)
        while True:
            output = sink.get(timeout=OUTPUT_TIMEOUT_SECONDS)
            if output.error is not None:
                raise RunError(f"generation failed: {output.error}")
            display.write(output.text)
            if output.stats is not None:
                display.finish()
                out.write("\n")
                out.flush()
                print(format_stats(output.stats, loaded.load_seconds), file=err)
                return 0
    finally:
        engine.shutdown()
