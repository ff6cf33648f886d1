"""Decoding one 30-second window: greedy or sampled tokens under Whisper's logit rules.

Source: OpenAI `whisper/decoding.py` (`SuppressBlank`, `SuppressTokens`,
`ApplyTimestampRules`, `GreedyDecoder`, `detect_language`), with one sample per temperature
(no best-of, no beam search).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel_audio.whisper.loading import WhisperModel
from mlxcel_audio.whisper.model import KVCache
from mlxcel_core.sampling import Sampler, SamplingParams, is_greedy

MAX_INITIAL_TIMESTAMP = 1.0  # seconds: the first timestamp of a window is at most this


@dataclass(frozen=True)
class DecodingResult:
    """One window's decoding.

    Attributes:
        tokens: the sampled tokens, text and timestamps, without the end of text.
        text: their text, stripped.
        avg_logprob: the sum of the sampled tokens' log-probabilities (with the end of
            text) over their count plus one.
        no_speech_prob: the probability of `<|nospeech|>` right after the start token.
        compression_ratio: bytes of the text over bytes of its zlib compression.
        temperature: the temperature sampled at (0 is greedy).
    """

    tokens: tuple[int, ...]
    text: str
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float


def encode_window(whisper: WhisperModel, features: mx.array) -> list[KVCache]:
    """The decoder's cross-attention keys and values for one window.

    Args:
        features: log-mel features of shape (3000, n_mels).
    """
    audio_states = whisper.model.encoder(
        features[None].astype(whisper.model.encoder.conv1.weight.dtype)
    )
    cross_kv = whisper.model.decoder.cross_kv(audio_states)
    mx.eval(cross_kv)
    return cross_kv


def detect_language(whisper: WhisperModel, cross_kv: list[KVCache]) -> str:
    """The language code whose token is most likely right after `<|startoftranscript|>`."""
    tokenizer = whisper.tokenizer
    logits, _ = whisper.model.decoder(mx.array([[tokenizer.sot]]), cross_kv)
    codes = list(tokenizer.language_tokens)
    language_logits = logits[0, -1][mx.array(list(tokenizer.language_tokens.values()))]
    return codes[int(mx.argmax(language_logits).item())]


def decode_window(
    whisper: WhisperModel,
    cross_kv: list[KVCache],
    *,
    sot_sequence: list[int],
    prompt: list[int],
    temperature: float,
    seed: int | None = None,
) -> DecodingResult:
    """Decode one window's tokens until end of text or half the text context.

    Args:
        cross_kv: from `encode_window`.
        sot_sequence: `<|startoftranscript|>`, then language and task tokens for
            multilingual models, then `<|notimestamps|>` to decode without timestamps.
        prompt: earlier text tokens to condition on (after `<|startofprev|>`); the most
            recent half-context of them is kept.
        temperature: 0 for greedy, else the temperature of a categorical draw.
        seed: the draw's seed when sampling; None draws one.
    """
    tokenizer = whisper.tokenizer
    n_text_ctx = whisper.dims.n_text_ctx
    initial = list(sot_sequence)
    if prompt:
        initial = [tokenizer.sot_prev, *prompt[-(n_text_ctx // 2 - 1) :], *initial]
    sot_index = initial.index(tokenizer.sot)
    rules = _LogitRules(whisper, timestamps=tokenizer.no_timestamps not in sot_sequence)
    sampler = None
    if not is_greedy(temperature):
        params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        sampler = Sampler(params)

    logits, cache = whisper.model.decoder(mx.array([initial]), cross_kv)
    no_speech_prob = mx.softmax(logits[0, sot_index])[tokenizer.no_speech].item()
    sampled: list[int] = []
    sum_logprob = 0.0
    for _ in range(min(n_text_ctx // 2, n_text_ctx - len(initial))):
        filtered = rules.apply(np.array(logits[0, -1]), sampled)
        logprobs = filtered - _logsumexp(filtered)
        if sampler is None:
            token = int(np.argmax(filtered))
        else:
            token = int(sampler(mx.array(filtered), mx.array(sampled, dtype=mx.int32)).item())
        sum_logprob += float(logprobs[token])
        if token == tokenizer.eot:
            break
        sampled.append(token)
        logits, cache = whisper.model.decoder(mx.array([[token]]), cross_kv, cache)
    text = tokenizer.decode(sampled).strip()
    return DecodingResult(
        tokens=tuple(sampled),
        text=text,
        avg_logprob=sum_logprob / (len(sampled) + 1),
        no_speech_prob=no_speech_prob,
        compression_ratio=compression_ratio(text),
        temperature=temperature,
    )


def compression_ratio(text: str) -> float:
    """Bytes of `text` over bytes of its zlib compression (high for repetitive text)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _logsumexp(x: np.ndarray) -> float:
    top = float(x.max())
    if top == -np.inf:
        return top
    return top + float(np.log(np.exp(x - top).sum()))


class _LogitRules:
    """Suppressed tokens, a non-blank start, and timestamps in pairs that never go back."""

    def __init__(self, whisper: WhisperModel, *, timestamps: bool):
        tokenizer = whisper.tokenizer
        self._suppress = np.array(whisper.suppress_tokens, dtype=np.int64)
        self._begin_suppress = np.array(whisper.begin_suppress_tokens, dtype=np.int64)
        self._timestamps = timestamps
        self._eot = tokenizer.eot
        self._no_timestamps = tokenizer.no_timestamps
        self._timestamp_begin = tokenizer.timestamp_begin
        self._max_initial = tokenizer.timestamp_begin + round(MAX_INITIAL_TIMESTAMP / 0.02)

    def apply(self, logits: np.ndarray, sampled: list[int]) -> np.ndarray:
        """The next token's logits (V,) float32, given the tokens sampled so far."""
        logits = logits.copy()
        if not sampled:
            logits[self._begin_suppress] = -np.inf
        logits[self._suppress] = -np.inf
        if not self._timestamps:
            logits[self._timestamp_begin :] = -np.inf
            return logits
        begin = self._timestamp_begin
        logits[self._no_timestamps] = -np.inf
        last_was_timestamp = len(sampled) >= 1 and sampled[-1] >= begin
        penultimate_was_timestamp = len(sampled) < 2 or sampled[-2] >= begin
        if last_was_timestamp:
            if penultimate_was_timestamp:  # a pair just closed: text or end of text next
                logits[begin:] = -np.inf
            else:  # an opened segment closes: no text
                logits[: self._eot] = -np.inf
        timestamps = [t for t in sampled if t >= begin]
        if timestamps:
            # Timestamps never decrease; after a closed pair they strictly increase.
            closing = last_was_timestamp and not penultimate_was_timestamp
            logits[begin : timestamps[-1] + (0 if closing else 1)] = -np.inf
        if not sampled:
            logits[:begin] = -np.inf
            logits[self._max_initial + 1 :] = -np.inf
        logprobs = logits - _logsumexp(logits)
        if _logsumexp(logprobs[begin:]) > logprobs[:begin].max():
            logits[:begin] = -np.inf
        return logits
