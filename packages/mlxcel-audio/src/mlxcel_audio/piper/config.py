"""A Piper voice's JSON config: what synthesis needs from it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from mlxcel_audio.piper.errors import VoiceLoadError

PHONEME_TYPES = ("espeak", "text")


@dataclass(frozen=True)
class VoiceConfig:
    """The fields of a Piper voice config (`<voice>.onnx.json`) that synthesis uses.

    Attributes:
        sample_rate: output rate in Hz (`audio.sample_rate`).
        noise_scale: scale of the prior's noise (`inference.noise_scale`).
        length_scale: phoneme duration multiplier, > 1 is slower (`inference.length_scale`).
        noise_w: scale of the duration predictor's noise (`inference.noise_w`).
        phoneme_type: "espeak" (espeak-ng IPA) or "text" (the text's own code points).
        espeak_voice: the espeak-ng voice name, such as "en-us".
        phoneme_id_map: phoneme -> ids.
        vowel_clusters: phoneme sequences merged into one phoneme before lookup.
        num_speakers: 1 for a single-speaker voice, else the number of speaker ids.
        speaker_ids: speaker name -> id; empty for single-speaker voices.
        default_speaker_id: the speaker of a multi-speaker voice when none is asked for.
    """

    sample_rate: int
    noise_scale: float
    length_scale: float
    noise_w: float
    phoneme_type: str
    espeak_voice: str
    phoneme_id_map: dict[str, tuple[int, ...]]
    vowel_clusters: frozenset[tuple[str, ...]]
    num_speakers: int
    speaker_ids: dict[str, int]
    default_speaker_id: int


def read_voice_config(path: Path) -> VoiceConfig:
    """Read a Piper voice config; defaults follow piper.config.PiperConfig.from_dict.

    Raises:
        VoiceLoadError: the file is missing, not JSON, lacks a required field, names a
            phoneme type other than "espeak" or "text", a sample rate below 1, a length
            scale that is not a positive number, a noise scale that is not finite, or
            a speaker id outside [0, num_speakers).
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise VoiceLoadError(f"cannot read the voice config {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise VoiceLoadError(f"the voice config {path} is not JSON: {error.msg}") from None
    try:
        inference = raw.get("inference", {})
        phoneme_type = raw.get("phoneme_type", "espeak")
        config = VoiceConfig(
            sample_rate=int(raw["audio"]["sample_rate"]),
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
            noise_w=float(inference.get("noise_w", 0.8)),
            phoneme_type=phoneme_type,
            espeak_voice=raw.get("espeak", {}).get("voice", ""),
            phoneme_id_map={k: tuple(v) for k, v in raw["phoneme_id_map"].items()},
            vowel_clusters=frozenset(tuple(c) for c in raw.get("vowel_clusters", ())),
            num_speakers=int(raw.get("num_speakers", 1)),
            speaker_ids={str(k): int(v) for k, v in raw.get("speaker_id_map", {}).items()},
            default_speaker_id=int(raw.get("default_speaker_id", 0)),
        )
    except KeyError as error:
        raise VoiceLoadError(f"the voice config {path} lacks the field {error.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError) as error:
        raise VoiceLoadError(f"the voice config {path} has a malformed field: {error}") from None
    if phoneme_type not in PHONEME_TYPES:
        raise VoiceLoadError(
            f"the voice config {path} has phoneme_type {phoneme_type!r}; "
            f"supported: {', '.join(PHONEME_TYPES)}"
        )
    _check_synthesis_numbers(config, path)
    ids = [*config.speaker_ids.values(), config.default_speaker_id]
    outside = [i for i in ids if not 0 <= i < config.num_speakers]
    if outside:
        raise VoiceLoadError(
            f"the voice config {path} has speaker id {outside[0]}, outside "
            f"[0, {config.num_speakers}) (num_speakers)"
        )
    return config


def _check_synthesis_numbers(config: VoiceConfig, path: Path) -> None:
    """Numbers that would otherwise fail only when speaking: a rate the encoders refuse,
    durations scaled by NaN or zero, noise scaled by NaN."""
    problem = None
    if config.sample_rate < 1:
        problem = f"audio.sample_rate {config.sample_rate} (must be at least 1)"
    elif not (math.isfinite(config.length_scale) and config.length_scale > 0):
        problem = f"inference.length_scale {config.length_scale} (must be a positive number)"
    else:
        for name, value in (("noise_scale", config.noise_scale), ("noise_w", config.noise_w)):
            if not math.isfinite(value):
                problem = f"inference.{name} {value} (must be a finite number)"
                break
    if problem is not None:
        raise VoiceLoadError(f"the voice config {path} has {problem}")
