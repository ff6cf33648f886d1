"""A Piper voice on MLX: load it, then synthesize text one sentence, or one piece of a long
sentence, at a time."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxcel_audio.errors import AudioInputError
from mlxcel_audio.piper.config import VoiceConfig, read_voice_config
from mlxcel_audio.piper.errors import VoiceLoadError
from mlxcel_audio.piper.model import Synthesis, Vits, make_vits
from mlxcel_audio.piper.phonemes import (
    check_espeak_voice,
    phoneme_ids,
    sentence_phoneme_ids,
    sentence_phonemes,
)
from mlxcel_audio.piper.pieces import MAX_PIECE_PHONEMES, split_phonemes
from mlxcel_audio.piper.weights import read_voice_weights

MIN_SPEED = 0.25
MAX_SPEED = 4.0


class PiperVoice:
    """A loaded Piper (VITS) voice.

    Attributes:
        sample_rate: output rate in Hz.
        speakers: a multi-speaker voice's speaker names in id order (its ids, as decimal
            text, where the config names none); empty for a single-speaker voice.
        config: the voice's JSON config.
    """

    def __init__(self, model: Vits, config: VoiceConfig):
        self.model = model
        self.config = config
        self.sample_rate = config.sample_rate
        names = {i: name for name, i in config.speaker_ids.items()}
        self.speakers: tuple[str, ...] = (
            tuple(names.get(i, str(i)) for i in range(config.num_speakers))
            if config.num_speakers > 1
            else ()
        )

    def speaker_id(self, speaker: str | int | None) -> int | None:
        """The speaker id `speaker` names: a name from the config's `speaker_id_map`, or an
        id (an int or its ASCII decimal text) in [0, num_speakers); a name wins over an id it
        spells. None is the config's `default_speaker_id` for a multi-speaker voice and
        None for a single-speaker one, which takes no speaker.

        Raises:
            AudioInputError: `speaker` is neither a name nor an id of this voice.
        """
        num_speakers = self.config.num_speakers
        if num_speakers == 1 and speaker is None:
            return None
        if num_speakers > 1:
            if speaker is None:
                return self.config.default_speaker_id
            if isinstance(speaker, str) and speaker in self.config.speaker_ids:
                return self.config.speaker_ids[speaker]
            text = str(speaker)
            # int() also reads digits of other scripts (Arabic-Indic, fullwidth): ids are ASCII.
            if text.isascii() and text.isdecimal() and int(text) < num_speakers:
                return int(text)
        known = (
            f"{', '.join(self.speakers[:10])} or an id below {num_speakers}"
            if self.speakers
            else "none: it has one speaker"
        )
        raise AudioInputError(f"unknown speaker {speaker!r}; this voice's speakers: {known}")

    def synthesize(
        self,
        text: str,
        *,
        speaker: str | None = None,
        speed: float = 1.0,
        seed: int | None = None,
        max_piece_phonemes: int | None = MAX_PIECE_PHONEMES,
    ) -> Iterator[np.ndarray]:
        """Speak `text` in the voice of `speaker` (a name or id, `speaker_id`), yielding each
        sentence's audio as soon as it is ready; a sentence of
        more than `max_piece_phonemes` phonemes is spoken in pieces (`split_phonemes`), each
        yielded as soon as it is ready, so that its cost grows with its length as short
        sentences' does (docs/adr/0009-piper-long-sentences.md). None speaks every sentence
        whole.

        Each array is (N,) float32 mono at `sample_rate`, scaled so its peak is 1 as Piper
        does by default (`SynthesisConfig.normalize_audio`), per sentence or piece; the
        arrays concatenate into the speech. `speed` divides the voice's length scale; `seed`
        fixes the noise (a fresh one per call otherwise).

        Raises:
            AudioInputError: the text is empty or has nothing to speak, `speaker` is not
                a speaker of this voice, `speed` is outside [0.25, 4.0], or `seed` is
                outside [0, 2**64) (MLX's keys are unsigned 64-bit). Raised before the
                first sentence is synthesized.
            ValueError: `max_piece_phonemes` is below 1.
        """
        speaker_id = self.speaker_id(speaker)
        if not (MIN_SPEED <= speed <= MAX_SPEED):
            raise AudioInputError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
        if seed is not None and not 0 <= seed < 2**64:
            raise AudioInputError(f"seed must be in [0, 2**64), got {seed}")
        if not text.strip():
            raise AudioInputError("the text to speak is empty")
        pieces = self.piece_ids(text, max_piece_phonemes)
        if not pieces:
            raise AudioInputError("the text has nothing to speak")
        seed = secrets.randbits(63) if seed is None else seed
        return self._pieces(pieces, speaker_id, speed, seed)

    def _pieces(
        self, pieces: list[list[int]], speaker_id: int | None, speed: float, seed: int
    ) -> Iterator[np.ndarray]:
        keys = mx.random.split(mx.random.key(seed), len(pieces))
        for ids, key in zip(pieces, keys, strict=True):
            audio = self.synthesize_ids(ids, speaker=speaker_id, speed=speed, key=key).audio
            peak = float(np.max(np.abs(audio)))
            yield (audio / peak if peak > 1e-8 else np.zeros_like(audio)).astype(np.float32)

    def synthesize_ids(
        self,
        phoneme_ids: list[int],
        *,
        speaker: str | int | None = None,
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
        key: mx.array | None = None,
    ) -> Synthesis:
        """One utterance from phoneme ids, unnormalized, with its durations in frames.

        `speaker` is a name or id as `speaker_id` takes it. Noise scales default to the voice
        config's; 0 makes synthesis deterministic.

        Raises:
            AudioInputError: `speaker` is not a speaker of this voice.
        """
        return self.model.synthesize(
            phoneme_ids,
            speaker_id=self.speaker_id(speaker),
            length_scale=self.config.length_scale / speed,
            noise_scale=self.config.noise_scale if noise_scale is None else noise_scale,
            noise_w=self.config.noise_w if noise_w is None else noise_w,
            key=mx.random.key(secrets.randbits(63)) if key is None else key,
        )

    def phoneme_ids(self, text: str) -> list[list[int]]:
        """Phoneme ids of each sentence of `text` (Piper's phonemizer and id rules)."""
        return sentence_phoneme_ids(text, self.config)

    def piece_ids(
        self, text: str, max_piece_phonemes: int | None = MAX_PIECE_PHONEMES
    ) -> list[list[int]]:
        """Phoneme ids of each utterance `synthesize` speaks for `text`: its sentences, the
        longer ones cut into pieces of at most `max_piece_phonemes` phonemes (None: whole).

        Raises:
            ValueError: `max_piece_phonemes` is below 1.
        """
        sentences = sentence_phonemes(text, self.config)
        if max_piece_phonemes is not None:
            sentences = [
                piece
                for sentence in sentences
                for piece in split_phonemes(sentence, max_piece_phonemes)
            ]
        return [phoneme_ids(phonemes, self.config) for phonemes in sentences]


def load_voice(onnx_path: str | Path, config_path: str | Path | None = None) -> PiperVoice:
    """Load a Piper voice: its ONNX file and JSON config (default: `onnx_path` + ".json").

    Raises:
        VoiceLoadError: (a `ModelLoadError`) a file is missing or unreadable, its weights
            do not fit a Piper VITS model, the config's `num_speakers` differs from the
            number of speaker embeddings in the weights, or espeak-ng has no voice of the
            config's `espeak.voice`.
    """
    onnx_path = Path(onnx_path)
    config_path = Path(f"{onnx_path}.json") if config_path is None else Path(config_path)
    if not onnx_path.is_file():
        raise VoiceLoadError(f"no voice file at {onnx_path}")
    config = read_voice_config(config_path)
    check_espeak_voice(config)
    model = make_vits(read_voice_weights(onnx_path))
    if model.num_speakers != config.num_speakers:
        raise VoiceLoadError(
            f"{config_path} says num_speakers {config.num_speakers}, but {onnx_path} holds "
            f"{model.num_speakers}"
        )
    return PiperVoice(model, config)
