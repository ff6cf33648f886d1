"""Log-mel features against a plain numpy reference written from Whisper's definition."""

from __future__ import annotations

import numpy as np
from speech_clips import HELLO, speech

from mlxcel_audio.features import N_FRAMES, N_SAMPLES, log_mel_spectrogram, mel_filters, pad_or_trim


def reference_mel_filters(n_mels: int, sample_rate: int = 16_000, n_fft: int = 400) -> np.ndarray:
    """Slaney-scale triangles with area normalization, evaluated bin by bin."""

    def hz_to_mel(hz):
        return hz * 3 / 200 if hz < 1000 else 15 + np.log(hz / 1000) * 27 / np.log(6.4)

    def mel_to_hz(mel):
        return mel * 200 / 3 if mel < 15 else 1000 * np.exp((mel - 15) * np.log(6.4) / 27)

    edges = [mel_to_hz(m) for m in np.linspace(0, hz_to_mel(sample_rate / 2), n_mels + 2)]
    filters = np.zeros((n_mels, n_fft // 2 + 1))
    for i in range(n_mels):
        low, centre, high = edges[i : i + 3]
        for j in range(n_fft // 2 + 1):
            f = j * sample_rate / n_fft
            up, down = (f - low) / (centre - low), (high - f) / (high - centre)
            filters[i, j] = max(0.0, min(up, down)) * 2 / (high - low)
    return filters


def reference_log_mel(audio: np.ndarray, n_mels: int) -> np.ndarray:
    padded = np.pad(audio.astype(np.float64), 200, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    frames = np.stack([padded[i : i + 400] for i in range(0, len(padded) - 399, 160)])
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    mel = power[:-1] @ reference_mel_filters(n_mels).T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def test_mel_filters_match_the_slaney_definition():
    for n_mels in (80, 128):
        np.testing.assert_allclose(mel_filters(n_mels), reference_mel_filters(n_mels), atol=1e-6)


def test_log_mel_matches_the_reference_on_speech():
    audio = speech(HELLO)
    for n_mels in (80, 128):
        features = np.array(log_mel_spectrogram(audio, n_mels))
        expected = reference_log_mel(audio, n_mels)
        assert features.shape == expected.shape == (len(audio) // 160, n_mels)
        np.testing.assert_allclose(features, expected, atol=2e-3)


def test_padding_adds_thirty_seconds_of_frames_and_windows_are_whole():
    audio = speech(HELLO)
    features = log_mel_spectrogram(audio, padding=N_SAMPLES)
    assert features.shape == ((len(audio) + N_SAMPLES) // 160, 80)
    assert pad_or_trim(features[:100]).shape == (N_FRAMES, 80)
    assert pad_or_trim(features).shape == (N_FRAMES, 80)
