"""decode_audio: containers detected from content, resampling, and refusals of bad input."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile
from speech_clips import HELLO, speech

from mlxcel_audio.decoding import SAMPLE_RATE, decode_audio
from mlxcel_audio.errors import AudioInputError

SOUNDFILE_FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"),
                     "ogg": ("OGG", "VORBIS"), "mp3": ("MP3", "MPEG_LAYER_III")}  # fmt: skip
PYAV_FORMATS = {"m4a": ("ipod", "aac"), "mp4": ("mp4", "aac"), "webm": ("webm", "libopus")}


def encode_with_soundfile(samples: np.ndarray, name: str, rate: int = SAMPLE_RATE) -> bytes:
    container, subtype = SOUNDFILE_FORMATS[name]
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=container, subtype=subtype)
    return buffer.getvalue()


def encode_with_pyav(samples: np.ndarray, name: str) -> bytes:
    """`samples` (16 kHz) in the container, resampled to 48 kHz as AAC and Opus expect."""
    container_format, codec = PYAV_FORMATS[name]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=48_000, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=48_000)
        for resampled in [*resampler.resample(frame), *resampler.resample(None)]:
            container.mux(stream.encode(resampled))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def encoded(name: str) -> bytes:
    samples = speech(HELLO)
    if name in PYAV_FORMATS:
        return encode_with_pyav(samples, name)
    return encode_with_soundfile(samples, name)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Peak normalized cross-correlation within 100 ms of lag (codecs add delay)."""
    best = 0.0
    for lag in range(0, 1600, 8):
        length = min(len(a), len(b) - lag)
        x, y = a[:length], b[lag : lag + length]
        best = max(best, float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-9)))
    return best


@pytest.mark.parametrize("name", [*SOUNDFILE_FORMATS, *PYAV_FORMATS])
def test_every_container_decodes_to_the_same_speech(name):
    original = speech(HELLO)
    decoded = decode_audio(encoded(name))
    assert decoded.dtype == np.float32 and decoded.ndim == 1
    assert abs(len(decoded) - len(original)) < 0.1 * SAMPLE_RATE
    # Lossy codecs shift phases: the waveforms only roughly agree; the transcripts must match
    # (test_whisper_transcribe.py).
    assert similarity(original, decoded) > 0.7


def test_other_rates_and_stereo_are_resampled_and_mixed_down():
    original = speech(HELLO)
    stereo_44k = np.stack([original, original], axis=1)
    stereo_44k = np.interp(
        np.arange(int(len(original) * 44_100 / SAMPLE_RATE)) * SAMPLE_RATE / 44_100,
        np.arange(len(original)), original,
    ).astype(np.float32)[:, None].repeat(2, axis=1)  # fmt: skip
    buffer = io.BytesIO()
    soundfile.write(buffer, stereo_44k, 44_100, format="WAV", subtype="FLOAT")
    decoded = decode_audio(buffer.getvalue())
    assert abs(len(decoded) - len(original)) <= 2
    assert similarity(original, decoded) > 0.99


def test_empty_input_is_refused():
    with pytest.raises(AudioInputError, match="empty"):
        decode_audio(b"")


def test_text_named_wav_is_refused():
    with pytest.raises(AudioInputError, match="not audio"):
        decode_audio(b"this is a text file, not a recording\n" * 20)


@pytest.mark.parametrize("name", ["mp3", "flac", "ogg", "m4a"])
@pytest.mark.parametrize("kept", [0.5, 0.02])
def test_truncated_files_are_refused(name, kept):
    data = encoded(name)
    with pytest.raises(AudioInputError):
        decode_audio(data[: int(len(data) * kept)])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_float_wav_with_non_finite_samples_is_refused(bad):
    samples = speech(HELLO).copy()
    samples[100:200] = bad
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, SAMPLE_RATE, format="WAV", subtype="FLOAT")
    with pytest.raises(AudioInputError, match="100 samples that are NaN or infinite"):
        decode_audio(buffer.getvalue())


def test_clipped_float_wav_decodes_within_full_scale():
    samples = speech(HELLO) * 20
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, SAMPLE_RATE, format="WAV", subtype="FLOAT")
    decoded = decode_audio(buffer.getvalue())
    assert np.abs(decoded).max() == 1.0
    assert similarity(decoded, np.clip(samples, -1, 1)) > 0.99
