"""Encode synthesized speech into the formats of OpenAI's speech API.

wav (16-bit PCM), flac, mp3 (MPEG layer III, libsndfile >= 1.1) and opus (Ogg, resampled
to 48 kHz with soxr, since Opus takes no 22.05 kHz input) go through soundfile; aac (ADTS)
through PyAV's encoder; pcm is raw signed 16-bit little-endian mono, as OpenAI sends it.
"""

from __future__ import annotations

import io

import av
import numpy as np
import soundfile
import soxr

from mlxcel_audio.errors import AudioInputError

AUDIO_FORMATS = ("wav", "flac", "mp3", "opus", "aac", "pcm")

_MIME_TYPES = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "pcm": "audio/pcm",
}
# format -> (soundfile container, subtype)
_SOUNDFILE = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}
OPUS_SAMPLE_RATE = 48_000


class UnsupportedAudioFormatError(AudioInputError):
    """An output format other than those in AUDIO_FORMATS."""


def encode_audio(samples: np.ndarray, sample_rate: int, audio_format: str) -> bytes:
    """Encode mono samples as one file (or raw stream, for "pcm") in `audio_format`.

    Args:
        samples: (N,) float in [-1, 1]; values beyond are clipped.
        sample_rate: rate of `samples` in Hz; kept in the output except for opus (48 kHz).
        audio_format: one of AUDIO_FORMATS.

    Raises:
        UnsupportedAudioFormatError: `audio_format` is not one of AUDIO_FORMATS, or the
            installed libsndfile cannot write it (mp3 needs libsndfile >= 1.1).
    """
    _check_format(audio_format)
    samples = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    if audio_format == "pcm":
        return (samples * 32767.0).astype("<i2").tobytes()
    if audio_format == "aac":
        return _encode_aac(samples, sample_rate)
    if audio_format == "opus":
        samples = soxr.resample(samples, sample_rate, OPUS_SAMPLE_RATE).astype(np.float32)
        sample_rate = OPUS_SAMPLE_RATE
    container, subtype = _SOUNDFILE[audio_format]
    if subtype not in soundfile.available_subtypes(container):
        raise UnsupportedAudioFormatError(
            f"this libsndfile ({soundfile.__libsndfile_version__}) cannot write {audio_format}"
        )
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, sample_rate, format=container, subtype=subtype)
    return buffer.getvalue()


def audio_mime_type(audio_format: str) -> str:
    """The Content-Type of `audio_format`'s bytes, such as "audio/mpeg" for mp3.

    Raises:
        UnsupportedAudioFormatError: `audio_format` is not one of AUDIO_FORMATS.
    """
    _check_format(audio_format)
    return _MIME_TYPES[audio_format]


def _check_format(audio_format: str) -> None:
    if audio_format not in AUDIO_FORMATS:
        raise UnsupportedAudioFormatError(
            f"unsupported audio format {audio_format!r}; supported: {', '.join(AUDIO_FORMATS)}"
        )


def _encode_aac(samples: np.ndarray, sample_rate: int) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="adts") as container:
        stream = container.add_stream("aac", rate=sample_rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
        frame.sample_rate = sample_rate
        for packet in (*stream.encode(frame), *stream.encode(None)):
            container.mux(packet)
    return buffer.getvalue()
