"""`mlxcel serve`'s own flags (llama-server's names): where it listens, who may call it,
what it serves, and the server settings they make with the engine and sampling flags."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlxcel.common.engine_flags import engine_config_from
from mlxcel.common.flags import Flag, UsageError, flag_error, sampling_params_from
from mlxcel.common.media_flags import image_decoder_from
from mlxcel.serving.webui_flags import static_path_from
from mlxcel_core.errors import InputError
from mlxcel_server import ServerSettings
from mlxcel_server.reasoning import ReasoningFormat

SERVER_FLAGS = (
    Flag(("--host",), "host", str, "127.0.0.1", "address to listen on", env="LLAMA_ARG_HOST"),
    Flag(("--port",), "port", int, 8080, "port to listen on", env="LLAMA_ARG_PORT"),
    Flag(("-a", "--alias"), "alias", str, None, "the model's name in the API",
         env="LLAMA_ARG_ALIAS"),
    Flag(("--max-queue",), "max_queue", int, 64,
         "most requests waiting to run; more are answered 503 with Retry-After"),
    Flag(("-n", "--n-predict"), "n_predict", int, -1,
         "default tokens to generate per request; -1 = until the context is full",
         env="LLAMA_ARG_N_PREDICT"),
    Flag(("--api-key",), "api_key", str, None, "API key(s), comma-separated",
         env="LLAMA_API_KEY"),
    Flag(("--api-key-file",), "api_key_file", str, None, "a file with one API key per line",
         env="LLAMA_ARG_API_KEY_FILE"),
    Flag(("--timeout",), "timeout", int, 600, "seconds to wait for a client's request data",
         env="LLAMA_ARG_TIMEOUT"),
    Flag(("--cors",), "cors", str, None,
         "origins allowed cross-origin access, comma-separated, or '*'", env="LLAMA_ARG_CORS"),
    Flag(("--metrics",), "metrics", bool, False, "serve Prometheus metrics at GET /metrics",
         env="LLAMA_ARG_ENDPOINT_METRICS", is_switch=True),
    Flag(("--slots",), "slots", bool, False, "serve slot monitoring at GET /slots",
         env="LLAMA_ARG_ENDPOINT_SLOTS", is_switch=True),
    Flag(("--props",), "props", bool, False,
         "llama-server's switch for POST /props; mlxcel refuses property changes either way",
         env="LLAMA_ARG_ENDPOINT_PROPS", is_switch=True),
    Flag(("--reasoning-format",), "reasoning_format", str, "auto",
         "where reasoning goes: none (left in content), deepseek (reasoning_content), "
         "deepseek-legacy (both), auto", env="LLAMA_ARG_THINK"),
    Flag(("--log-disable",), "log_disable", bool, False,
         "print no log lines: no access line per request, no listening and ready lines "
         "(errors are still printed)", is_switch=True),
    Flag(("--reasoning-budget",), "reasoning_budget", int, -1,
         "most reasoning tokens per reply, then the answer; -1 = no limit, 0 = no reasoning",
         env="LLAMA_ARG_THINK_BUDGET"),
)  # fmt: skip


def _split(text: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (text or "").split(",") if item.strip())


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    keys = _split(args.api_key)
    if args.api_key_file is not None:
        try:
            lines = Path(args.api_key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise InputError(f"cannot read --api-key-file {args.api_key_file}: {error}") from error
        keys += tuple(line.strip() for line in lines if line.strip())
    if not keys and (args.api_key is not None or args.api_key_file is not None):
        # An empty key list would silently turn authentication off.
        raise UsageError("--api-key/--api-key-file gave no keys; give at least one")
    return keys


def settings_from(args: argparse.Namespace) -> ServerSettings:
    """Server settings from resolved flags.

    Raises:
        UsageError: a value is out of range or unsupported.
        InputError: the API key file cannot be read, or `--allowed-local-media-path` or
            `--path` is not a directory.
    """
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in [1, 65535], got {args.port}")
    if args.timeout < 1:
        raise UsageError(f"--timeout must be >= 1 second, got {args.timeout}")
    if args.reasoning_format not in set(ReasoningFormat):
        raise UsageError(
            f"--reasoning-format must be one of {', '.join(ReasoningFormat)}, "
            f"got {args.reasoning_format!r}"
        )
    if args.reasoning_budget < -1:
        raise UsageError(f"--reasoning-budget must be -1 or >= 0, got {args.reasoning_budget}")
    if args.audio_max_bytes < 1:
        raise UsageError(f"--audio-max-bytes must be >= 1, got {args.audio_max_bytes}")
    try:
        return ServerSettings(
            model_alias=args.alias,
            context_size=args.ctx_size,
            n_predict=args.n_predict,
            engine=engine_config_from(args, max_waiting=args.max_queue),
            sampling=sampling_params_from(args),
            api_keys=_api_keys(args),
            cors_origins=_split(args.cors),
            audio_max_bytes=args.audio_max_bytes,
            endpoint_metrics=args.metrics,
            endpoint_slots=args.slots,
            endpoint_props=args.props,
            reasoning_format=ReasoningFormat(args.reasoning_format),
            reasoning_budget=args.reasoning_budget,
            image_decoder=image_decoder_from(args),
            webui=not args.no_webui,
            static_path=static_path_from(args),
        )
    except ValueError as error:
        raise flag_error(str(error), _FLAG_NAMES) from error


# The flags behind `ServerSettings`' own fields, for its errors.
_FLAG_NAMES = {
    "context_size": "-c/--ctx-size",
    "n_predict": "-n/--n-predict",
}
