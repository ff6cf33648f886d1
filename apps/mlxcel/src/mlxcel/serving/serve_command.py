"""`mlxcel serve` (and `mlxcel-server`): the OpenAI-compatible server on Hypercorn.

The server listens at once and answers 503 while the model loads on a background thread;
SIGINT/SIGTERM stop accepting connections, let in-flight requests finish (up to the
graceful timeout, then they end with an error event) and shut the engine down.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from hypercorn.asyncio import serve
from hypercorn.config import Config

from mlxcel.common.adapter_flags import ADAPTER_FLAGS, adapter_specs_from
from mlxcel.common.autotune_settings import apply_autotune
from mlxcel.common.chat_prompt import TEMPLATE_FLAGS, chat_template_from
from mlxcel.common.engine_flags import (
    ENGINE_FLAGS,
    check_cache_types_fit,
    describe_kv_cache,
    warn_beyond_trained_context,
)
from mlxcel.common.flags import (
    BATCH_SIZE_FLAG,
    CTX_SIZE_FLAG,
    MODEL_FLAG,
    SAMPLING_FLAGS,
    RunError,
    UsageError,
    add_command,
    resolve_defaults,
)
from mlxcel.common.gguf_flags import GGUF_DEQUANT_FLAG
from mlxcel.common.kernel_flags import METAL_KERNELS_FLAG, apply_kernel_flags
from mlxcel.common.llama_server_flags import LLAMA_SERVER_FLAGS, apply_llama_server_flags
from mlxcel.common.loading import compute_options, describe_weights, load_target_model
from mlxcel.common.media_flags import MEDIA_FLAGS
from mlxcel.common.memory_preflight import MEMORY_FLAGS, check_memory
from mlxcel.common.speculative_flags import check_draft_model_path, load_draft_model
from mlxcel.common.surgery_flags import SURGERY_FLAG, surgery_plan_from
from mlxcel.distributed.disaggregate_flags import (
    DISAGGREGATE_FLAG,
    DisaggregatedRank,
    check_disaggregate,
    disaggregated_rank,
)
from mlxcel.distributed.parallel_flags import (
    PARALLEL_FLAGS,
    ParallelRank,
    check_parallel,
    parallel_mode_from,
    parallel_rank,
)
from mlxcel.distributed.stage_faults import (
    STAGE_TIMEOUT_FLAG,
    check_stage_timeout,
    exit_now_if_degraded,
    guard_prefill,
    guard_stages,
)
from mlxcel.models.store_flags import STORE_FLAGS, resolve_store_flags
from mlxcel.serving.access_log import access_logger
from mlxcel.serving.server_flags import SERVER_FLAGS, settings_from
from mlxcel.serving.webui_flags import WEBUI_FLAGS
from mlxcel.speech.audio_flags import AUDIO_FLAGS, serving_audio, speech_model_paths
from mlxcel_core.engine import (
    Engine,
    InsufficientMemoryError,
    RemotePrefillFactory,
    RunnerFactory,
)
from mlxcel_core.threads import thread_stream
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loaded import LoadedModel
from mlxcel_server import ServerSettings, ServerState, ServingModel, create_app
from mlxcel_server.audio_models import ServingAudio

logger = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_SECONDS = 10.0
# Time for requests ended by the engine to send their error event and close.
ENGINE_STOP_SECONDS = 5.0

FLAGS = (
    MODEL_FLAG,
    *STORE_FLAGS,
    CTX_SIZE_FLAG,
    BATCH_SIZE_FLAG,
    *ENGINE_FLAGS,
    *MEMORY_FLAGS,
    *ADAPTER_FLAGS,
    SURGERY_FLAG,
    GGUF_DEQUANT_FLAG,
    *SERVER_FLAGS,
    *WEBUI_FLAGS,
    *TEMPLATE_FLAGS,
    *AUDIO_FLAGS,
    *MEDIA_FLAGS,
    METAL_KERNELS_FLAG,
    *SAMPLING_FLAGS,
    *PARALLEL_FLAGS,
    STAGE_TIMEOUT_FLAG,
    DISAGGREGATE_FLAG,
    *LLAMA_SERVER_FLAGS,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    add_command(subparsers, "serve", __doc__, FLAGS, run)


def serving_model(
    loaded: LoadedModel,
    settings: ServerSettings,
    draft: LoadedModel | None = None,
    *,
    make_runner: RunnerFactory | None = None,
    make_remote_prefill: RemotePrefillFactory | None = None,
) -> ServingModel:
    """Start an engine on `loaded` (with its draft model, if any) and name it as the API will;
    `make_runner` builds the engine's model runner (`--tp`/`--pp`'s lockstep runner),
    `make_remote_prefill` where prompts are prefilled (`--disaggregate`'s prefill rank).

    Raises:
        InsufficientMemoryError: the KV cache cannot hold one sequence of the context size.
        ValueError: the draft model does not fit the model (see `Engine`).
    """
    model_id = settings.model_alias or Path(loaded.source.path).name
    context_size = settings.context_size or loaded.config.context_length
    config = replace(settings.engine, context_size=context_size)
    draft_model = None if draft is None else draft.model
    engine = Engine(
        loaded.model,
        config,
        draft_model=draft_model,
        on_fatal=_exit_process,
        adapters=loaded.row_adapters,
        make_runner=make_runner,
        make_remote_prefill=make_remote_prefill,
    )
    return ServingModel(loaded, engine, model_id, context_size)


def _exit_process(error: BaseException) -> None:
    # A broken engine invariant leaves a server that cannot generate; a supervisor restarts
    # a process that exits, so exit rather than linger.
    logger.critical("mlxcel: the engine stopped on an internal error (%s); exiting", error)
    os._exit(70)


Models = tuple[LoadedModel, LoadedModel | None, ServingAudio | None]


def _loader(
    args: argparse.Namespace,
    settings: ServerSettings,
    err: TextIO,
    rank: ParallelRank | None = None,
) -> Callable[[], Models]:
    """Checks that the models fit in memory (`check_memory`, its estimate on `err`), then
    loads the model and adapters the flags name (keeping `rank`'s part of it under
    `--tp`/`--pp`, its chat template replaced by `--chat-template(-file)`'s), then the
    draft model, on the calling thread's stream, then the speech models.

    Raises:
        UsageError: the adapter, chat template or speech flags conflict, or the template
            name is unknown.
        InputError: an adapter folder, the template file, the draft model or a speech
            model does not exist.
        SurgeryError: the `--surgery` file cannot be read or is invalid.
    """
    template = chat_template_from(args)
    adapters = adapter_specs_from(args)
    check_draft_model_path(args)
    surgery = surgery_plan_from(args)
    speech_paths = speech_model_paths(args)

    compute = _serving_compute(args)

    def load() -> Models:
        check_memory(args, err, compute, running_sequences=args.parallel)
        with thread_stream():
            loaded = load_target_model(args, adapters, surgery, compute)
            check_cache_types_fit(args, loaded)
            context_size = settings.context_size or loaded.config.context_length
            warn_beyond_trained_context(context_size, loaded.config.context_length, err)
            if template is not None:
                loaded.tokenizer.chat_template = template
            if rank is not None:
                loaded = rank.prepare(loaded)
            draft = load_draft_model(args, loaded)
            return loaded, draft, serving_audio(speech_paths, settings)

    return load


async def serve_until_stopped(
    app,
    config: Config,
    state: ServerState,
    settings: ServerSettings,
    load_models: Callable[[], Models],
    make_runner: RunnerFactory | None = None,
    make_remote_prefill: RemotePrefillFactory | None = None,
    *,
    err: TextIO,
    announce: bool = True,
) -> None:
    """Serve `app` while `load_models` runs on a thread (the model, its draft model and the
    speech models); stop on SIGINT/SIGTERM. `make_runner` builds the engine's model runner,
    `make_remote_prefill` where its prompts are prefilled. Once the engine runs, one line on
    `err` says so (unless `announce` is False), with the model's name in the API and the
    load and the engine's set-up times.

    Raises:
        ModelLoadError: the model, an adapter, the draft model or a speech model cannot be
            loaded (the server stops).
        UsageError: the draft model does not fit the model, or a KV cache type cannot store
            the model's head dim.
        RunError: the models and one sequence of the context size do not fit in memory
            (estimated before loading), or the KV cache cannot hold one such sequence.
        Exception: whatever else loading raised, once the server has stopped.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    failures: list[Exception] = []

    def load() -> None:
        try:
            loaded, draft, audio = load_models()
            if audio is not None:
                state.set_audio(audio)
            setup_start = time.perf_counter()
            serving = serving_model(
                loaded,
                settings,
                draft,
                make_runner=make_runner,
                make_remote_prefill=make_remote_prefill,
            )
            state.set_ready(serving)
            setup_seconds = time.perf_counter() - setup_start
            if announce:
                print(
                    f"mlxcel: ready: {serving.model_id} loaded in {loaded.load_seconds:.2f} s, "
                    f"engine set up in {setup_seconds:.2f} s",
                    file=err,
                    flush=True,
                )
                print(f"mlxcel: {describe_weights(loaded)}", file=err, flush=True)
                kv_cache = describe_kv_cache(loaded, serving.engine.config)
                if kv_cache is not None:
                    print(f"mlxcel: {kv_cache}", file=err, flush=True)
        except (ModelLoadError, UsageError, RunError) as error:
            failures.append(error)
            loop.call_soon_threadsafe(stop.set)
        except InsufficientMemoryError as error:
            failures.append(RunError(str(error)))
            loop.call_soon_threadsafe(stop.set)
        # The draft model does not fit the model, or a KV cache type cannot store the
        # model's head dim (CacheTypeError).
        except ValueError as error:
            failures.append(UsageError(str(error)))
            loop.call_soon_threadsafe(stop.set)
        except Exception as error:
            # Anything else is a defect: the server stops and reports it rather than
            # answering "the model is loading" for ever.
            failures.append(error)
            loop.call_soon_threadsafe(stop.set)

    async def end_requests_after_grace() -> None:
        # Requests still running after the grace period are ended through the engine, so
        # each ends with an error event while Hypercorn still waits for its response.
        await stop.wait()
        await asyncio.sleep(GRACEFUL_SHUTDOWN_SECONDS)
        await asyncio.to_thread(state.close)

    loader = threading.Thread(target=load, name="mlxcel-load", daemon=True)
    loader.start()
    closer = asyncio.create_task(end_requests_after_grace())
    try:
        await serve(app, config, shutdown_trigger=stop.wait)
    finally:
        closer.cancel()
        await asyncio.to_thread(loader.join)
        state.close()
    if failures:
        raise failures[0]


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    resolve_defaults(args, FLAGS, environ)
    apply_llama_server_flags(args, err)
    resolve_store_flags(args, environ)
    apply_autotune(args, environ, err)
    apply_kernel_flags(args)
    settings = settings_from(args)
    check_parallel(args, settings.engine)
    check_stage_timeout(args)
    check_disaggregate(args, settings.engine)
    with (
        parallel_rank(args, environ, err, keep_front_up=True) as rank,
        disaggregated_rank(args, environ) as pair,
    ):
        if rank is not None and not rank.is_front:
            return _follow(args, settings, rank, err)
        if pair is not None and not pair.is_front:
            return _prefill(args, settings, pair, err)
        code = _serve(args, settings, rank, err, pair)
    exit_now_if_degraded(rank or pair, code)
    return code


def _serving_compute(args: argparse.Namespace) -> ComputeOptions:
    """The compute options for `-np` streams at once; ranks that split the model (`--tp`,
    `--pp`, `--disaggregate`) keep the dense weights their split was measured with."""
    split = parallel_mode_from(args) is not None or args.disaggregate
    return compute_options(None if split else args.parallel)


def _follow(
    args: argparse.Namespace, settings: ServerSettings, rank: ParallelRank, err: TextIO
) -> int:
    """A rank > 0 of `--tp`/`--pp`: load the model and keep this rank's part, then run
    rank 0's engine steps; no HTTP."""
    adapters = adapter_specs_from(args)
    surgery = surgery_plan_from(args)
    compute = _serving_compute(args)
    check_memory(args, err, compute, running_sequences=args.parallel)
    loaded = rank.prepare(load_target_model(args, adapters, surgery, compute))
    return rank.follow(loaded, settings.engine)


def _prefill(
    args: argparse.Namespace, settings: ServerSettings, pair: DisaggregatedRank, err: TextIO
) -> int:
    """Rank 1 of `--disaggregate`: load the model, then prefill rank 0's prompts; no HTTP."""
    adapters = adapter_specs_from(args)
    surgery = surgery_plan_from(args)
    compute = _serving_compute(args)
    check_memory(args, err, compute, running_sequences=args.parallel)
    loaded = load_target_model(args, adapters, surgery, compute)
    context_size = settings.context_size or loaded.config.context_length
    return pair.serve_prefills(loaded, settings.engine, context_size)


def _serve(
    args: argparse.Namespace,
    settings: ServerSettings,
    rank: ParallelRank | None,
    err: TextIO,
    pair: DisaggregatedRank | None = None,
) -> int:
    load_models = _loader(args, settings, err, rank)
    state = ServerState()
    make_remote_prefill = (
        None
        if pair is None
        else guard_prefill(
            pair, state, args.stage_timeout, settings.engine.scheduler.max_prefill_chunk, err
        )
    )
    make_runner = (
        None
        if rank is None
        else rank.make_runner(
            guard_stages(rank, state, args.stage_timeout, err, reports=args.metrics)
        )
    )
    app = create_app(state, settings)
    config = Config()
    config.bind = [f"{args.host}:{args.port}"]
    config.read_timeout = args.timeout
    config.graceful_timeout = GRACEFUL_SHUTDOWN_SECONDS + ENGINE_STOP_SECONDS
    config.accesslog = None if args.log_disable else access_logger(err)
    if args.log_disable:
        config.loglevel = "WARNING"  # Hypercorn's own "Running on" line is INFO
    _check_can_listen(args.host, args.port)
    if not args.log_disable:
        print(f"mlxcel: listening on http://{args.host}:{args.port}", file=err, flush=True)
    try:
        asyncio.run(
            serve_until_stopped(
                app,
                config,
                state,
                settings,
                load_models,
                make_runner,
                make_remote_prefill,
                err=err,
                announce=not args.log_disable,
            )
        )
    except OSError as error:
        message = f"cannot listen on {args.host}:{args.port}: {error.strerror or error}"
        raise RunError(message) from error
    return 0


def _check_can_listen(host: str, port: int) -> None:
    """Bind once before announcing the address, so a taken port is reported as such.

    Raises:
        RunError: the address cannot be bound (in use, unknown host, no permission).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(infos[0][4])
    except OSError as error:
        raise RunError(f"cannot listen on {host}:{port}: {error.strerror or error}") from error
