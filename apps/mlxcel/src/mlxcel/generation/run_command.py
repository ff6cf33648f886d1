"""`mlxcel run [MODEL]`: chat with a model in the terminal; with -p, answer once and exit.

Every turn re-renders the conversation with the chat template; the engine's prefix cache
makes the part already seen cheap. Without a terminal, each line of the input is a message
and only the replies are written to stdout. See docs/run.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from mlxcel.common.adapter_flags import ADAPTER_FLAGS, adapter_specs_from
from mlxcel.common.autotune_settings import apply_autotune
from mlxcel.common.chat_prompt import (
    CHAT_FLAGS,
    chat_template_from,
    check_chat_template,
    check_text,
    encode_conversation,
    system_messages,
)
from mlxcel.common.engine_flags import ENGINE_FLAGS, engine_config_from, open_engine
from mlxcel.common.flags import (
    BATCH_SIZE_FLAG,
    CTX_SIZE_FLAG,
    MODEL_FLAG,
    N_PREDICT_FLAG,
    SAMPLING_FLAGS,
    Flag,
    UsageError,
    add_flags,
    resolve_defaults,
    sampling_params_from,
)
from mlxcel.common.gguf_flags import GGUF_DEQUANT_FLAG
from mlxcel.common.kernel_flags import METAL_KERNELS_FLAG, apply_kernel_flags
from mlxcel.common.llama_server_flags import LLAMA_SERVER_FLAGS, apply_llama_server_flags
from mlxcel.common.loading import compute_options, load_target_model
from mlxcel.common.memory_preflight import MEMORY_FLAGS, check_memory
from mlxcel.common.speculative_flags import check_draft_model_path
from mlxcel.common.surgery_flags import SURGERY_FLAG, surgery_plan_from
from mlxcel.generation.chat_session import ChatSession, ChatSettings
from mlxcel.generation.generate_command import check_length_flags, generate_one
from mlxcel.generation.repl import run_repl
from mlxcel.generation.repl_input import PipedReader, TerminalReader, terminal_history
from mlxcel.generation.reply_reasoning import (
    REASONING_FLAGS,
    check_reasoning_budget,
    reply_reasoning,
    thinking_template_kwargs,
)
from mlxcel.models.store_flags import STORE_FLAGS, resolve_store_flags
from mlxcel_core.errors import InputError

CACHE_DIR_VARIABLE = "MLXCEL_CACHE_DIR"
HISTORY_FILE_NAME = "run_history"

FLAGS = (
    MODEL_FLAG,
    *STORE_FLAGS,
    *MEMORY_FLAGS,
    CTX_SIZE_FLAG,
    BATCH_SIZE_FLAG,
    Flag(("-p", "--prompt"), "prompt", str, None,
         "answer this prompt once, as `generate` does, and exit"),
    N_PREDICT_FLAG,
    *CHAT_FLAGS,
    *REASONING_FLAGS,
    *ENGINE_FLAGS,
    *ADAPTER_FLAGS,
    SURGERY_FLAG,
    GGUF_DEQUANT_FLAG,
    *SAMPLING_FLAGS,
    METAL_KERNELS_FLAG,
    *LLAMA_SERVER_FLAGS,
)  # fmt: skip


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", description=__doc__)
    parser.add_argument(
        "model_argument",
        nargs="?",
        metavar="MODEL",
        help="a GGUF file or a safetensors folder, as -m (default: embedded SmolLM2-135M)",
    )
    add_flags(parser, FLAGS)
    parser.set_defaults(command=run)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    resolve_defaults(args, FLAGS, environ)
    apply_llama_server_flags(args, err)
    args.model = _model_from(args)
    resolve_store_flags(args, environ)
    apply_autotune(args, environ, err)
    apply_kernel_flags(args)
    params = sampling_params_from(args)
    check_length_flags(args)
    check_reasoning_budget(args)
    adapters = adapter_specs_from(args)
    # Engine and draft flags are checked before the model loads, not after.
    engine_config = engine_config_from(args, max_waiting=1)
    check_draft_model_path(args)
    compute = compute_options(1)  # one reply at a time
    check_memory(args, err, compute, running_sequences=1)
    template = chat_template_from(args)
    system = system_messages(args)
    prompt = None if args.prompt is None else check_text(args.prompt, "prompt")
    surgery = surgery_plan_from(args)
    loaded = load_target_model(args, adapters, surgery, compute)
    check_chat_template(loaded.tokenizer, template)
    if prompt is not None:
        messages = [*system, {"role": "user", "content": prompt}]
        kwargs = thinking_template_kwargs(loaded.tokenizer, template, args.reasoning_budget)
        tokens = encode_conversation(loaded.tokenizer, messages, template, kwargs)
        reasoning = reply_reasoning(loaded.tokenizer, template, tokens, args.reasoning_budget)
        return generate_one(args, loaded, engine_config, tokens, reasoning, params, out, err)
    context_size = args.ctx_size or loaded.config.context_length
    settings = ChatSettings(
        params=params,
        context_size=context_size,
        max_tokens=args.n_predict,
        chat_template=template,
        system_messages=tuple(system),
        reasoning_budget=args.reasoning_budget,
    )
    engine = open_engine(args, loaded, engine_config, context_size=context_size, err=err)
    try:
        session = ChatSession(engine, loaded.tokenizer, settings)
        return _chat(session, args.show_reasoning, environ, out, err)
    finally:
        engine.shutdown()


def _chat(
    session: ChatSession,
    show_reasoning: bool,
    environ: Mapping[str, str],
    out: TextIO,
    err: TextIO,
) -> int:
    """The chat loop on a terminal when stdin and `out` are one, else on piped lines."""
    try:
        if not (sys.stdin.isatty() and out.isatty()):
            reader = PipedReader(sys.stdin)
            return run_repl(session, reader, out, err, show_reasoning=show_reasoning)
        with terminal_history(history_path(environ)):
            reader = TerminalReader()
            return run_repl(session, reader, out, err, show_reasoning=show_reasoning)
    except UnicodeDecodeError as error:
        raise InputError(f"the input is not valid UTF-8 text ({error.reason})") from error


def _model_from(args: argparse.Namespace) -> str | None:
    """The model MODEL or -m names (-m from the environment yields to MODEL).

    Raises:
        UsageError: MODEL and -m on the command line name different models.
    """
    if args.model_argument is None:
        return args.model
    if "model" in args.from_command_line and args.model != args.model_argument:
        raise UsageError(
            f"two models given: MODEL {args.model_argument!r} and -m {args.model!r}; "
            "give one of them"
        )
    return args.model_argument


def history_path(environ: Mapping[str, str]) -> Path:
    """Where the typed lines are kept between sessions:
    `${MLXCEL_CACHE_DIR:-~/.cache/mlxcel}/run_history`."""
    cache_dir = environ.get(CACHE_DIR_VARIABLE) or "~/.cache/mlxcel"
    return Path(cache_dir).expanduser() / HISTORY_FILE_NAME
