"""Whisper's log-mel spectrogram, computed in MLX.

Source: OpenAI Whisper `whisper/audio.py` (`log_mel_spectrogram`, `pad_or_trim`), with the
mel filter bank of librosa's `filters.mel` (Slaney scale and area normalization), which
Whisper ships precomputed and which is computed here instead.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx
import numpy as np

from mlxcel_audio.decoding import SAMPLE_RATE

N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 frames of 10 ms in a 30-second window


@cache
def mel_filters(n_mels: int, *, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """Triangular mel filters on the Slaney scale, each normalized to unit area.

    Returns:
        float32 weights of shape (n_mels, n_fft // 2 + 1), as librosa.filters.mel(sr=
        sample_rate, n_fft=n_fft, n_mels=n_mels) (htk=False, norm="slaney").
    """
    fft_freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    mel_points = _mel_to_hz(np.linspace(0.0, _hz_to_mel(sample_rate / 2), n_mels + 2))
    widths = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (mel_points[2:] - mel_points[:-2]))[:, None]
    return weights.astype(np.float32)


# The Slaney mel scale: linear below 1 kHz, logarithmic above.
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOG_STEP = np.log(6.4) / 27.0


def _hz_to_mel(hz: float) -> float:
    if hz < _MIN_LOG_HZ:
        return hz / _F_SP
    return _MIN_LOG_MEL + float(np.log(hz / _MIN_LOG_HZ)) / _LOG_STEP


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    linear = _F_SP * mels
    logarithmic = _MIN_LOG_HZ * np.exp(_LOG_STEP * (mels - _MIN_LOG_MEL))
    return np.where(mels >= _MIN_LOG_MEL, logarithmic, linear)


def log_mel_spectrogram(
    audio: np.ndarray | mx.array, n_mels: int = 80, *, padding: int = 0
) -> mx.array:
    """Whisper's input features for 16 kHz mono audio.

    A centered STFT (reflect padding, periodic Hann window of 400 samples, hop 160), power
    spectrum, mel filter bank, log10 floored at 1e-10 and at 8 below the maximum, then
    scaled as (x + 4) / 4.

    Args:
        audio: float32 samples at 16 kHz, shape (num_samples,).
        n_mels: mel bins: 80, or 128 for large-v3 models.
        padding: zero samples appended first (Whisper appends 30 s so the last window is
            whole).

    Returns:
        float32 features of shape (num_frames, n_mels), num_frames = (num_samples +
        padding) // 160.
    """
    samples = mx.array(audio, dtype=mx.float32)
    if padding:
        samples = mx.concatenate([samples, mx.zeros((padding,), dtype=mx.float32)])
    half = N_FFT // 2
    samples = mx.concatenate([samples[1 : half + 1][::-1], samples, samples[-half - 1 : -1][::-1]])
    num_frames = 1 + (samples.shape[0] - N_FFT) // HOP_LENGTH
    starts = mx.arange(num_frames)[:, None] * HOP_LENGTH
    frames = samples[starts + mx.arange(N_FFT)[None, :]]
    window = mx.array(np.hanning(N_FFT + 1)[:-1].astype(np.float32))
    power = mx.abs(mx.fft.rfft(frames * window, axis=-1)) ** 2
    mel = power[:-1] @ mx.array(mel_filters(n_mels)).T
    log_spec = mx.log10(mx.maximum(mel, 1e-10))
    log_spec = mx.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def pad_or_trim(features: mx.array, num_frames: int = N_FRAMES) -> mx.array:
    """Features of shape (num_frames, n_mels): cut, or padded with zeros at the end."""
    length = features.shape[0]
    if length >= num_frames:
        return features[:num_frames]
    return mx.pad(features, [(0, num_frames - length), (0, 0)])
