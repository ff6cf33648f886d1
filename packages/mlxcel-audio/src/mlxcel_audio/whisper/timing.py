"""Word timestamps: the decoded text aligned with the audio through cross-attention.

Source: OpenAI `whisper/timing.py` (`find_alignment`, `merge_punctuations`,
`add_word_timestamps`) and `whisper/tokenizer.py` (`split_to_word_tokens`). The
cross-attention of the model's alignment heads over a teacher-forced pass of the text is
turned into a token-by-frame cost, and dynamic time warping (Sakoe & Chiba 1978) finds the
monotonic path through it; a word starts where the path first reaches its first token.
"""

from __future__ import annotations

import itertools
import string
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel_audio.whisper.loading import WhisperModel
from mlxcel_audio.whisper.model import KVCache

FRAMES_PER_SECOND = 50  # audio frames (after the encoder's stride 2) per second: 20 ms each
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"  # noqa: RUF001 (full-width marks)
SENTENCE_END_MARKS = ".。!！?？"  # noqa: RUF001
# Languages written without spaces between words: words are split per character instead.
_UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})


@dataclass(frozen=True)
class Word:
    """A spoken word: its text (with its leading space), start and end in seconds from the
    start of the audio, and the mean probability of its tokens."""

    word: str
    start: float
    end: float
    probability: float


@dataclass
class WordTiming:
    """A word being aligned: its text, tokens, start and end (seconds) and probability;
    mutable, as punctuation merging and the duration caps adjust it."""

    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def split_to_word_tokens(
    whisper: WhisperModel, tokens: list[int], language: str
) -> list[tuple[str, list[int]]]:
    """`tokens` grouped into words: a new word at a leading space or a punctuation mark,
    or at every whole character for languages written without spaces.

    Returns:
        (word text, its tokens) pairs whose tokens concatenate to `tokens`.
    """
    pieces = _split_on_unicode(whisper, tokens)
    if language in _UNSPACED_LANGUAGES:
        return pieces
    words: list[tuple[str, list[int]]] = []
    for text, piece_tokens in pieces:
        starts_word = text.startswith(" ") or text.strip() in string.punctuation
        if starts_word or not words:
            words.append((text, list(piece_tokens)))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + piece_tokens)
    return words


def _split_on_unicode(whisper: WhisperModel, tokens: list[int]) -> list[tuple[str, list[int]]]:
    """Tokens grouped so that each group decodes to whole characters (a character's UTF-8
    bytes may span tokens)."""
    decode = whisper.tokenizer.decode
    full = decode(tokens)
    pieces: list[tuple[str, list[int]]] = []
    current: list[int] = []
    offset = 0
    for token in tokens:
        current.append(token)
        text = decode(current)
        replacement = text.find("\ufffd")
        if replacement < 0 or full[offset + replacement : offset + replacement + 1] == "\ufffd":
            pieces.append((text, current))
            current = []
            offset += len(text)
    return pieces


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """The running median over the last axis, `width` odd, edges padded by reflection."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.median(windows, axis=-1)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through `cost` (N, M) from (0, 0) to (N-1, M-1),
    stepping down, right or diagonally.

    Returns:
        Row and column indices of the path's cells, in order, each int64 of the same length.
    """
    N, M = cost.shape
    total = np.full((N + 1, M + 1), np.inf)
    total[0, 0] = 0.0
    trace = np.zeros((N + 1, M + 1), dtype=np.int8)
    for i in range(1, N + 1):
        above, row, step = total[i - 1].tolist(), [np.inf] * (M + 1), [0] * (M + 1)
        costs = cost[i - 1].tolist()
        for j in range(1, M + 1):
            diagonal, up, left = above[j - 1], above[j], row[j - 1]
            if diagonal < up and diagonal < left:
                best, move = diagonal, 0
            elif up < diagonal and up < left:
                best, move = up, 1
            else:
                best, move = left, 2
            row[j] = costs[j - 1] + best
            step[j] = move
        total[i], trace[i] = row, step
    trace[0, :], trace[:, 0] = 2, 1
    path = []
    i, j = N, M
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        move = trace[i, j]
        i, j = (i - 1, j - 1) if move == 0 else (i - 1, j) if move == 1 else (i, j - 1)
    rows, columns = np.array(path[::-1], dtype=np.int64).T
    return rows, columns


def find_alignment(
    whisper: WhisperModel,
    cross_kv: list[KVCache],
    *,
    sot_sequence: list[int],
    text_tokens: list[int],
    num_frames: int,
    language: str,
) -> list[WordTiming]:
    """Each word of `text_tokens` with its start and end in seconds from the window's start.

    Args:
        cross_kv: the window's, from `encode_window`.
        sot_sequence: the start-of-transcript tokens the text was decoded after.
        text_tokens: the window's text tokens, without timestamps or special tokens.
        num_frames: the window's log-mel frames that hold audio (at most 3000).
        language: the language code, which decides how text splits into words.
    """
    tokenizer = whisper.tokenizer
    tokens = [*sot_sequence, tokenizer.no_timestamps, *text_tokens, tokenizer.eot]
    logits, scores = whisper.model.decoder.cross_attention_scores(mx.array([tokens]), cross_kv)
    heads = mx.stack([scores[layer][0, head] for layer, head in whisper.alignment_heads])
    weights = mx.softmax(heads[:, :, : num_frames // 2], axis=-1, precise=True)
    probabilities = mx.softmax(logits[0, len(sot_sequence) : -2, : tokenizer.eot], axis=-1)
    weights, probabilities = np.array(weights), np.array(probabilities)
    # Normalised over the tokens (as the reference does), then smoothed along time.
    weights = (weights - weights.mean(axis=-2, keepdims=True)) / weights.std(axis=-2, keepdims=True)
    matrix = median_filter(weights, MEDIAN_FILTER_WIDTH).mean(axis=0)
    rows, frames = dtw(-matrix[len(sot_sequence) : -1])
    token_probabilities = probabilities[np.arange(len(text_tokens)), text_tokens]

    words = split_to_word_tokens(whisper, text_tokens, language)
    boundaries = np.cumsum([0] + [len(word_tokens) for _, word_tokens in words])
    jumps = np.diff(rows, prepend=-1).astype(bool)
    jump_times = frames[jumps] / FRAMES_PER_SECOND
    return [
        WordTiming(
            word=text,
            tokens=word_tokens,
            start=float(jump_times[begin]),
            end=float(jump_times[end]),
            probability=float(token_probabilities[begin:end].mean()),
        )
        for (text, word_tokens), begin, end in zip(
            words, boundaries[:-1], boundaries[1:], strict=True
        )
    ]


def merge_punctuations(timings: list[WordTiming]) -> list[WordTiming]:
    """Opening punctuation joined to the word after it and closing punctuation to the word
    before it; the words they leave empty are dropped."""
    following = len(timings) - 1
    for previous in range(len(timings) - 2, -1, -1):
        before, after = timings[previous], timings[following]
        if before.word.startswith(" ") and before.word.strip() in PREPEND_PUNCTUATIONS:
            after.word, after.tokens = before.word + after.word, before.tokens + after.tokens
            before.word, before.tokens = "", []
        else:
            following = previous
    previous = 0
    for following in range(1, len(timings)):
        before, after = timings[previous], timings[following]
        if not before.word.endswith(" ") and after.word in APPEND_PUNCTUATIONS:
            before.word, before.tokens = before.word + after.word, before.tokens + after.tokens
            after.word, after.tokens = "", []
        else:
            previous = following
    return [timing for timing in timings if timing.word]


@dataclass(frozen=True)
class TimedSpan:
    """A segment's start and end (seconds from the start of the audio) and its words."""

    start: float
    end: float
    words: tuple[Word, ...]


def add_word_timestamps(
    whisper: WhisperModel,
    cross_kv: list[KVCache],
    spans: list[tuple[float, float, tuple[int, ...]]],
    *,
    sot_sequence: list[int],
    num_frames: int,
    time_offset: float,
    language: str,
    last_speech_timestamp: float,
) -> list[TimedSpan]:
    """The words of one window's segments, and the segments' times moved to their words.

    Word durations are capped at twice the median word duration (at most 1.4 s) next to a
    sentence end, after a long pause, and at a segment's edges, as the reference does.

    Args:
        cross_kv: the window's, from `encode_window`.
        spans: the window's segments as (start s, end s, tokens) relative to the window.
        sot_sequence: the start-of-transcript tokens the window was decoded after.
        num_frames: the window's log-mel frames that hold audio (at most 3000).
        time_offset: the window's start in seconds from the start of the audio.
        language: the language code, which decides how text splits into words.
        last_speech_timestamp: the end of the previous segment in seconds (0 at first).

    Returns:
        One `TimedSpan` per span, in order.
    """
    eot = whisper.tokenizer.eot
    span_tokens = [[t for t in tokens if t < eot] for _, _, tokens in spans]
    text_tokens = [t for tokens in span_tokens for t in tokens]
    if not text_tokens:
        return [TimedSpan(time_offset + s, time_offset + e, ()) for s, e, _ in spans]
    timings = find_alignment(
        whisper, cross_kv, sot_sequence=sot_sequence, text_tokens=text_tokens,
        num_frames=num_frames, language=language,
    )  # fmt: skip
    durations = np.array([t.end - t.start for t in timings])
    durations = durations[durations.nonzero()]
    median_duration = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    max_duration = median_duration * 2
    if len(durations):
        for before, timing in itertools.pairwise(timings):
            if timing.end - timing.start > max_duration:
                if timing.word in SENTENCE_END_MARKS:
                    timing.end = timing.start + max_duration
                elif before.word in SENTENCE_END_MARKS:
                    timing.start = timing.end - max_duration
    timings = merge_punctuations(timings)

    for timing in timings:
        timing.start += time_offset
        timing.end += time_offset

    result = []
    index = 0
    for (span_start, span_end, _), tokens in zip(spans, span_tokens, strict=True):
        words: list[WordTiming] = []
        num_tokens = 0
        while index < len(timings) and num_tokens < len(tokens):
            words.append(timings[index])
            num_tokens += len(timings[index].tokens)
            index += 1
        start, end = time_offset + span_start, time_offset + span_end
        if words:
            first, last = words[0], words[-1]
            _bound_first_words(words, last_speech_timestamp, median_duration, max_duration)
            # The segment's own timestamps win over a first or last word stretched past them.
            if start < first.end and start - 0.5 > first.start:
                first.start = max(0.0, min(first.end - median_duration, start))
            else:
                start = first.start
            if end > last.start and end + 0.5 < last.end:
                last.end = max(last.start + median_duration, end)
            else:
                end = last.end
            last_speech_timestamp = end
        result.append(TimedSpan(
            start=round(start, 3), end=round(end, 3),
            words=tuple(
                Word(t.word, round(t.start, 2), round(t.end, 2), round(t.probability, 4))
                for t in words
            ),
        ))  # fmt: skip
    return result


def _bound_first_words(
    words: list[WordTiming],
    last_speech_timestamp: float,
    median_duration: float,
    max_duration: float,
) -> None:
    """After a pause, the first words of a segment last at most `max_duration`: the time
    warping stretches them over the silence before them."""
    first = words[0]
    long_first = first.end - first.start > max_duration
    long_pair = len(words) > 1 and words[1].end - first.start > max_duration * 2
    if first.end - last_speech_timestamp <= median_duration * 4 or not (long_first or long_pair):
        return
    if len(words) > 1 and words[1].end - words[1].start > max_duration:
        boundary = max(words[1].end / 2, words[1].end - max_duration)
        first.end = words[1].start = boundary
    first.start = max(0.0, first.end - max_duration)
