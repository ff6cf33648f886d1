"""Uploaded audio to mono float32 samples, whatever the container, detected from the bytes."""

from __future__ import annotations

import io

import numpy as np
import soundfile
import soxr

from mlxcel_audio.errors import AudioInputError, MissingDecoderError

SAMPLE_RATE = 16_000
_TRUNCATION_MARGIN = 0.05


def decode_audio(data: bytes, *, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Decode an audio file's bytes to mono samples at `sample_rate`.

    The container is detected from the content, never a file name: libsndfile (soundfile)
    reads wav, flac, ogg/vorbis, opus and mp3; PyAV reads the rest (mp4, m4a, webm, mpeg).
    Channels are averaged; soxr resamples (its "HQ" quality).

    Args:
        data: the whole file.
        sample_rate: the rate of the samples returned, in Hz.

    Returns:
        float32 samples in [-1, 1], shape (num_samples,).

    Raises:
        AudioInputError: the bytes are empty, truncated or not audio, or hold no samples, or
            samples that are NaN or infinite.
        MissingDecoderError: the container needs PyAV and it is not installed.
    """
    if not data:
        raise AudioInputError("the audio file is empty")
    try:
        samples, rate = _read_with_soundfile(data)
    except soundfile.LibsndfileError:  # not a format libsndfile reads
        samples, rate = _read_with_pyav(data)
    if samples.size == 0:
        raise AudioInputError("the audio file holds no samples")
    # Float WAVs can store NaN and infinity; one such sample poisons every mel frame of its
    # window, and Whisper then decodes noise as text.
    non_finite = samples.size - int(np.isfinite(samples).sum())
    if non_finite:
        raise AudioInputError(f"the audio file holds {non_finite} samples that are NaN or infinite")
    if rate != sample_rate:
        samples = soxr.resample(samples, rate, sample_rate)
    return np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False)


def _read_with_soundfile(data: bytes) -> tuple[np.ndarray, int]:
    with soundfile.SoundFile(io.BytesIO(data)) as sound:
        samples = sound.read(dtype="float32", always_2d=True)
        declared, rate = sound.frames, sound.samplerate
    # An mp3 cut short still decodes up to the cut; its header (Xing/Info) tells the length
    # it should have. The margin allows for estimated lengths of headerless streams.
    if len(samples) < declared * (1 - _TRUNCATION_MARGIN):
        raise AudioInputError(
            f"the audio file is truncated: {len(samples) / rate:.2f} s of the "
            f"{declared / rate:.2f} s its header declares"
        )
    return samples.mean(axis=1), rate


def _read_with_pyav(data: bytes) -> tuple[np.ndarray, int]:
    try:
        import av
    except ImportError:
        raise MissingDecoderError(
            "this audio format needs PyAV to decode it: pip install av"
        ) from None
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise AudioInputError("the file has no audio stream")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono")
            chunks = [
                resampled.to_ndarray().reshape(-1)
                for frame in container.decode(stream)
                for resampled in resampler.resample(frame)
            ]
            chunks += [flushed.to_ndarray().reshape(-1) for flushed in resampler.resample(None)]
            rate = stream.rate
    except av.FFmpegError as error:
        reason = error.strerror or type(error).__name__
        raise AudioInputError(f"the file is not audio in a known format ({reason})") from None
    if not chunks:
        raise AudioInputError("the audio file holds no samples")
    return np.concatenate(chunks), int(rate)
