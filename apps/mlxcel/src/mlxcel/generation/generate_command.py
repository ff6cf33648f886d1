"""`mlxcel generate`: one prompt in, streamed text out, timings on stderr.

Generation runs on the continuous-batching engine, so the KV cache, speculative decoding
and engine flags work as they do in `serve`. With `--prompts-file`, many prompts run
together (see `batch_generate`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TextIO

from mlxcel.common.adapter_flags import ADAPTER_FLAGS, adapter_specs_from
from mlxcel.common.autotune_settings import apply_autotune
from mlxcel.common.chat_prompt import (
    CHAT_FLAGS,
    chat_template_from,
    check_chat_template,
    check_text,
    encode_conversation,
    read_text_file,
    system_messages,
)
from mlxcel.common.engine_flags import (
    ENGINE_FLAGS,
    engine_config_from,
    open_engine,
    print_setup,
)
from mlxcel.common.flags import (
    BATCH_SIZE_FLAG,
    CTX_SIZE_FLAG,
    MODEL_FLAG,
    N_PREDICT_FLAG,
    SAMPLING_FLAGS,
    Flag,
    UsageError,
    add_command,
    pick_one,
    resolve_defaults,
    sampling_params_from,
)
from mlxcel.common.gguf_flags import GGUF_DEQUANT_FLAG
from mlxcel.common.kernel_flags import METAL_KERNELS_FLAG, apply_kernel_flags
from mlxcel.common.llama_server_flags import LLAMA_SERVER_FLAGS, apply_llama_server_flags
from mlxcel.common.loading import compute_options, load_target_model
from mlxcel.common.media_flags import IMAGE_FLAGS, check_image_mode, read_images
from mlxcel.common.memory_preflight import MEMORY_FLAGS, check_memory
from mlxcel.common.speculative_flags import check_draft_model_path
from mlxcel.common.surgery_flags import SURGERY_FLAG, surgery_plan_from
from mlxcel.distributed.parallel_flags import (
    PARALLEL_FLAGS,
    check_parallel,
    parallel_mode_from,
    parallel_rank,
)
from mlxcel.generation.batch_generate import read_prompts, run_batch
from mlxcel.generation.reasoning_display import ReasoningDisplay, stream_is_terminal
from mlxcel.generation.reply_reasoning import (
    REASONING_FLAGS,
    ReplyReasoning,
    check_reasoning_budget,
    reply_reasoning,
    thinking_template_kwargs,
)
from mlxcel.generation.reply_stream import ReplyInterrupted, make_reply_request, stream_reply
from mlxcel.models.store_flags import STORE_FLAGS, resolve_store_flags
from mlxcel_core.engine import EngineConfig, RunnerFactory
from mlxcel_core.errors import InputError
from mlxcel_core.images import PromptImage
from mlxcel_core.request import FinishReason, GenerationStats
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.image_prompt import ImagePrompt
from mlxcel_models.loaded import LoadedModel

PROMPT_FLAGS = (
    Flag(("-p", "--prompt"), "prompt", str, None, "the prompt"),
    Flag(("-f", "--file"), "file", str, None, "read the prompt from a file"),
    Flag(("--prompts-file",), "prompts_file", str, None,
         "one prompt per line, generated together (-np at once); JSON lines out"),
    N_PREDICT_FLAG,
    *CHAT_FLAGS,
    Flag(("-no-cnv", "--no-conversation"), "raw", bool, False,
         "raw completion: send the prompt as it is, without the chat template",
         is_switch=True),
)  # fmt: skip
FLAGS = (
    MODEL_FLAG,
    *STORE_FLAGS,
    CTX_SIZE_FLAG,
    BATCH_SIZE_FLAG,
    *PROMPT_FLAGS,
    *IMAGE_FLAGS,
    *REASONING_FLAGS,
    *ENGINE_FLAGS,
    *MEMORY_FLAGS,
    *ADAPTER_FLAGS,
    SURGERY_FLAG,
    GGUF_DEQUANT_FLAG,
    *SAMPLING_FLAGS,
    *PARALLEL_FLAGS,
    METAL_KERNELS_FLAG,
    *LLAMA_SERVER_FLAGS,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    add_command(subparsers, "generate", __doc__, FLAGS, run)


def _read_prompts(args: argparse.Namespace) -> list[str]:
    source = pick_one(
        args, ("prompt", "file", "prompts_file"), "the prompt with -p, -f or --prompts-file"
    )
    if source is None:
        raise UsageError("no prompt: give one with -p PROMPT, -f FILE or --prompts-file FILE")
    if source == "prompt":
        return [check_text(args.prompt, "prompt")]
    if source == "prompts_file":
        text = read_text_file(args.prompts_file, "prompts file")
        return read_prompts(text, args.prompts_file)
    prompt = read_text_file(args.file, "prompt file")
    # As llama.cpp's -f: the newline that ends a file's last line is not part of the prompt.
    return [prompt.removesuffix("\n")]


def prompt_tokens(loaded: LoadedModel, args: argparse.Namespace, prompt: str) -> list[int]:
    """Token ids of the prompt: through the chat template unless raw mode is asked for.

    Raises:
        UsageError: chat mode is asked for but the model has no chat template, or raw mode
            is asked for with a system prompt or a chat template.
    """
    tokenizer = loaded.tokenizer
    template = chat_template_from(args)
    if args.raw:
        if args.system_prompt is not None:
            raise UsageError("-sys/--system-prompt needs the chat template: drop -no-cnv")
        # One set in the environment for chat runs is left unused by a raw one.
        if {"chat_template", "chat_template_file"} & args.from_command_line:
            raise UsageError("a chat template needs chat mode, which -no-cnv turns off")
        return tokenizer.encode(prompt)
    messages = [*system_messages(args), {"role": "user", "content": prompt}]
    kwargs = thinking_template_kwargs(tokenizer, template, args.reasoning_budget)
    return encode_conversation(tokenizer, messages, template, kwargs)


def image_prompt(
    loaded: LoadedModel, args: argparse.Namespace, prompt: str, images: list[object]
) -> ImagePrompt:
    """The chat prompt whose user message holds `images`, in order, before `prompt`.

    Raises:
        InputError: the model has no vision support, or the template cannot render the
            message.
        UsageError: the model has no chat template.
    """
    prompter = loaded.image_prompter
    if prompter is None:
        raise InputError(
            f"the model {loaded.source.path.name} has no vision support; --image needs a "
            "vision-language model"
        )
    tokenizer = loaded.tokenizer
    template = chat_template_from(args)
    check_chat_template(tokenizer, template)
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": prompt}]
    messages = [*system_messages(args), {"role": "user", "content": content}]
    kwargs = thinking_template_kwargs(tokenizer, template, args.reasoning_budget)
    try:
        text = tokenizer.apply_chat_template(
            messages, chat_template=template, template_kwargs=kwargs
        )
        return prompter.encode(text, images)
    except ValueError as error:
        raise InputError(str(error)) from error


def format_stats(stats: GenerationStats, load_seconds: float, setup_seconds: float) -> str:
    """The stats lines on stderr: prompt and generation speed, drafts, peak memory and the
    start-up times (`load_seconds` reading the weights, `setup_seconds` starting the engine:
    its memory plan and KV cache). How the weights are held follows (`describe_weights`)."""
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
        f"peak memory: {stats.peak_memory_bytes / 2**20:.1f} MiB, load time: {load_seconds:.2f} s, "
        f"setup time: {setup_seconds:.2f} s"
    )
    return "\n".join(lines)


def check_length_flags(args: argparse.Namespace) -> None:
    """Raises `UsageError` when -n, -c or -b is out of range."""
    if args.n_predict < -1:
        raise UsageError(f"-n/--n-predict must be -1 or >= 0, got {args.n_predict}")
    if args.ctx_size < 0:
        raise UsageError(f"-c/--ctx-size must be >= 0, got {args.ctx_size}")
    if args.batch_size < 1:
        raise UsageError(f"-b/--batch-size must be >= 1, got {args.batch_size}")


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    resolve_defaults(args, FLAGS, environ)
    apply_llama_server_flags(args, err)
    resolve_store_flags(args, environ)
    apply_autotune(args, environ, err)
    apply_kernel_flags(args)
    prompts = _read_prompts(args)
    check_image_mode(args)
    images = read_images(args)
    params = sampling_params_from(args)
    check_length_flags(args)
    check_reasoning_budget(args)
    adapters = adapter_specs_from(args)
    # Engine and draft flags are checked before the model loads, not after.
    engine_config = engine_config_from(args, max_waiting=len(prompts))
    check_draft_model_path(args)
    check_parallel(args, engine_config)
    surgery = surgery_plan_from(args)
    # One prompt decodes alone; a prompts file decodes -np at once, so the engine sets
    # aside residual blocks and recurrent state for that many sequences. Ranks that split
    # the model keep the dense weights their sharding was measured with.
    batch = 1 if len(prompts) == 1 else min(args.parallel, len(prompts))
    engine_config = replace(
        engine_config, scheduler=replace(engine_config.scheduler, max_num_seqs=batch)
    )
    compute = compute_options(None if parallel_mode_from(args) is not None else batch)
    check_memory(args, err, compute, running_sequences=batch)
    with parallel_rank(args, environ, err) as rank:
        loaded = load_target_model(args, adapters, surgery, compute)
        if rank is None:
            return _generate(args, loaded, engine_config, prompts, images, params, out, err)
        loaded = rank.prepare(loaded)
        if not rank.is_front:
            return rank.follow(loaded, engine_config)
        return _generate(
            args,
            loaded,
            engine_config,
            prompts,
            images,
            params,
            out,
            err,
            make_runner=rank.make_runner(),
        )


def _generate(
    args: argparse.Namespace,
    loaded: LoadedModel,
    engine_config: EngineConfig,
    prompts: list[str],
    images: list[object],
    params: SamplingParams,
    out: TextIO,
    err: TextIO,
    *,
    make_runner: RunnerFactory | None = None,
) -> int:
    prompt_images: tuple[PromptImage, ...] = ()
    if images:
        with_images = image_prompt(loaded, args, prompts[0], images)
        token_ids = [list(with_images.prompt_ids)]
        prompt_images = with_images.images
    else:
        token_ids = [prompt_tokens(loaded, args, prompt) for prompt in prompts]
    # A prompts file's empty prompts get error rows of their own (`run_batch`).
    if args.prompts_file is None and not token_ids[0]:
        raise InputError("the prompt is empty: it encodes to no tokens")
    template = chat_template_from(args)
    reasoning = [
        reply_reasoning(loaded.tokenizer, template, ids, args.reasoning_budget) for ids in token_ids
    ]
    if args.prompts_file is not None:
        return run_batch(
            args,
            loaded,
            engine_config,
            prompts,
            token_ids,
            reasoning,
            params,
            out,
            err,
            make_runner=make_runner,
        )
    (tokens,) = token_ids
    return generate_one(
        args,
        loaded,
        engine_config,
        tokens,
        reasoning[0],
        params,
        out,
        err,
        make_runner=make_runner,
        images=prompt_images,
    )


def generate_one(
    args: argparse.Namespace,
    loaded: LoadedModel,
    engine_config: EngineConfig,
    tokens: list[int],
    reasoning: ReplyReasoning,
    params: SamplingParams,
    out: TextIO,
    err: TextIO,
    *,
    make_runner: RunnerFactory | None = None,
    images: tuple[PromptImage, ...] = (),
) -> int:
    """Stream one reply from the engine to `out`, its reasoning hidden unless
    `--show-reasoning`; timings to `err`. `make_runner` builds the engine's model runner
    (`--tp`/`--pp`'s lockstep runner); `images` are the prompt's image runs.

    Raises:
        InputError: the prompt does not fit the context.
        RunError: generation failed.
    """
    context_size = args.ctx_size or loaded.config.context_length
    if len(tokens) >= context_size:
        raise InputError(
            f"the prompt has {len(tokens)} tokens but the context size is {context_size}; "
            "shorten the prompt or raise -c/--ctx-size"
        )
    request = make_reply_request(
        loaded.tokenizer,
        tokens,
        params,
        context_size=context_size,
        max_tokens=args.n_predict,
        reasoning=reasoning,
        images=images,
    )
    display = ReasoningDisplay(
        out,
        reasoning.markers,
        reasoning.phase,
        show=args.show_reasoning,
        dim=stream_is_terminal(out),
    )
    setup_start = time.perf_counter()
    engine = open_engine(
        args,
        loaded,
        engine_config,
        context_size=context_size,
        err=err,
        make_runner=make_runner,
    )
    setup_seconds = time.perf_counter() - setup_start
    try:
        final = stream_reply(engine, request, display.write)
    except ReplyInterrupted as interrupted:
        # What was generated before the Ctrl-C is reported before the command ends.
        display.finish()
        _write_now(out, "\n")
        print(format_stats(interrupted.stats, loaded.load_seconds, setup_seconds), file=err)
        print_setup(loaded, engine.config, err)
        raise
    finally:
        engine.shutdown()
    display.finish()
    _write_now(out, "\n")
    stats = final.stats
    if (
        final.finish_reason is FinishReason.LENGTH
        and stats.prompt_tokens + stats.generated_tokens >= context_size
        and not 0 <= args.n_predict <= stats.generated_tokens
    ):
        print("the reply stopped at the end of the context; raise -c/--ctx-size", file=err)
    print(format_stats(stats, loaded.load_seconds, setup_seconds), file=err)
    print_setup(loaded, engine.config, err)
    return 0


def _write_now(out: TextIO, text: str) -> None:
    out.write(text)
    out.flush()
