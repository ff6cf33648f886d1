"""encode_audio: every format decodes back to the same speech at the right rate."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile

from mlxcel_audio.encoding import (
    AUDIO_FORMATS,
    UnsupportedAudioFormatError,
    audio_mime_type,
    encode_audio,
)
from mlxcel_audio.errors import AudioInputError

RATE = 22_050


@pytest.fixture(scope="module")
def tone() -> np.ndarray:
    """One second of a 440 Hz tone at half scale."""
    return (0.5 * np.sin(2 * np.pi * 440 * np.arange(RATE) / RATE)).astype(np.float32)


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    n = min(a.size, b.size)
    return float(np.corrcoef(a[:n], b[:n])[0, 1])


@pytest.mark.parametrize(("audio_format", "exact"), [("wav", True), ("flac", True), ("mp3", False)])
def test_soundfile_formats_round_trip_at_the_sample_rate(tone, audio_format, exact):
    data, rate = soundfile.read(io.BytesIO(encode_audio(tone, RATE, audio_format)), dtype="float32")

    assert rate == RATE
    if exact:
        np.testing.assert_allclose(data, tone, atol=1 / 32767)
    else:  # lossy, with encoder delay: the same tone, not the same samples
        assert abs(data.size - tone.size) < 0.1 * RATE
        assert np.isclose(np.sqrt(np.mean(data**2)), np.sqrt(np.mean(tone**2)), rtol=0.1)


def test_opus_is_ogg_at_48_khz(tone):
    encoded = encode_audio(tone, RATE, "opus")
    data, rate = soundfile.read(io.BytesIO(encoded), dtype="float32")

    assert encoded[:4] == b"OggS" and rate == 48_000
    assert abs(data.size - 48_000) < 0.05 * 48_000


def test_aac_is_adts_that_decodes_to_the_same_length(tone):
    with av.open(io.BytesIO(encode_audio(tone, RATE, "aac"))) as container:
        stream = container.streams.audio[0]
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])

    assert stream.codec_context.name == "aac" and stream.rate == RATE
    assert abs(decoded.size - tone.size) < 4096  # encoder priming and padding frames


def test_pcm_is_raw_little_endian_16_bit(tone):
    encoded = encode_audio(tone, RATE, "pcm")

    assert len(encoded) == 2 * tone.size
    samples = np.frombuffer(encoded, dtype="<i2")
    np.testing.assert_array_equal(samples, (tone * 32767).astype(np.int16))


def test_out_of_range_samples_are_clipped():
    encoded = encode_audio(np.array([-2.0, 0.0, 2.0], dtype=np.float32), RATE, "pcm")
    assert np.frombuffer(encoded, dtype="<i2").tolist() == [-32767, 0, 32767]


def test_every_format_has_a_mime_type():
    assert {f: audio_mime_type(f) for f in AUDIO_FORMATS}["mp3"] == "audio/mpeg"
    assert all(audio_mime_type(f).startswith("audio/") for f in AUDIO_FORMATS)


@pytest.mark.parametrize(
    "call", [lambda: encode_audio(np.zeros(4), RATE, "ogg"), lambda: audio_mime_type("m4a")]
)
def test_unknown_formats_raise(call):
    with pytest.raises(UnsupportedAudioFormatError, match="unsupported audio format") as raised:
        call()
    assert isinstance(raised.value, AudioInputError)


def test_a_format_libsndfile_cannot_write_is_refused(tone, monkeypatch):
    monkeypatch.setattr(soundfile, "available_subtypes", lambda container: {})
    with pytest.raises(UnsupportedAudioFormatError, match="cannot write mp3"):
        encode_audio(tone, RATE, "mp3")
