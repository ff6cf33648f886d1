"""Text -> phoneme ids per sentence, with Piper's own phonemizer and id rules.

espeak-ng (bundled with piper-tts as `piper.phonemize_espeak.EspeakPhonemizer`) splits the
text into sentences and gives IPA phonemes; `piper.phoneme_ids.phonemes_to_ids` adds BOS
`^`, EOS `$` and the PAD `_` after every phoneme, as Piper's training data had them.
"""

from __future__ import annotations

import threading
import unicodedata

from piper.phoneme_ids import phonemes_to_ids
from piper.phonemize_espeak import EspeakPhonemizer

from mlxcel_audio.piper.config import VoiceConfig
from mlxcel_audio.piper.errors import VoiceLoadError

# espeak-ng is a process-wide C library with one current voice: one caller at a time.
_ESPEAK_LOCK = threading.Lock()
_espeak: EspeakPhonemizer | None = None


def sentence_phoneme_ids(text: str, config: VoiceConfig) -> list[list[int]]:
    """Phoneme ids of each sentence of `text`, in order; sentences without phonemes are left
    out."""
    return [phoneme_ids(phonemes, config) for phonemes in sentence_phonemes(text, config)]


def phoneme_ids(phonemes: list[str], config: VoiceConfig) -> list[int]:
    """One utterance's ids, BOS and EOS included; phonemes missing from the voice's map are
    skipped, as Piper does."""
    return phonemes_to_ids(phonemes, config.phoneme_id_map)


def sentence_phonemes(text: str, config: VoiceConfig) -> list[list[str]]:
    """The phonemes (single characters) of each sentence of `text` that has any, in order."""
    return [phonemes for phonemes in _phonemize(text, config) if phonemes]


def check_espeak_voice(config: VoiceConfig) -> None:
    """Phonemize one word, so that a voice naming an espeak-ng voice that does not exist
    fails when it loads rather than on every request.

    Raises:
        VoiceLoadError: espeak-ng has no voice named `config.espeak_voice`.
    """
    if config.phoneme_type != "espeak":
        return
    try:
        _phonemize("a", config)
    except RuntimeError as error:  # espeakbridge.set_voice: "Failed to set voice: NAME"
        raise VoiceLoadError(
            f"espeak-ng has no voice {config.espeak_voice!r} (the config's espeak.voice): {error}"
        ) from None


def _phonemize(text: str, config: VoiceConfig) -> list[list[str]]:
    if config.phoneme_type == "text":
        return [list(unicodedata.normalize("NFD", text))]
    global _espeak
    with _ESPEAK_LOCK:
        if _espeak is None:
            _espeak = EspeakPhonemizer()
        return _espeak.phonemize(
            config.espeak_voice, text, vowel_clusters=set(config.vowel_clusters) or None
        )
