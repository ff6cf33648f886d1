"""Long sentences cut into pieces that the voice speaks one at a time.

VITS runs a whole sentence in one pass, and two of its parts cost more than linearly in the
sentence's length. Measured on a 300-word sentence without punctuation (3,553 phoneme ids,
83.5 s of audio) against its first 239 ids (6.1 s), on this project's 2-core CPU: the text
encoder's attention over all ids took 13.9 s and 1.4 GB (its relative-position scores are
(heads, T, 2T) arrays; 0.17 s and 74 MB at 239 ids), the HiFi-GAN decoder 43 s and 10.7 GB
of MLX memory at its peak (the shifted copies of a 2.1-million-sample signal; 1.2 s and
0.8 GB), the flow 5.0 s. Cutting the decoder's input alone would leave the encoder's
quadratic cost, so the sentence is cut, before synthesis (docs/adr/0009-piper-long-sentences.md).
"""

from __future__ import annotations

import math

# About 27 English words: pieces this long synthesize at the real-time factor of ordinary
# sentences, with about 650 MiB of MLX memory at the peak (ADR 0009).
MAX_PIECE_PHONEMES = 200
CLAUSE_PUNCTUATION = frozenset(",;:.!?")
WORD_BREAK = " "
# How espeak-ng writes a clause that ends in a comma: the voice gives it a comma's pause.
COMMA_ENDING = [",", WORD_BREAK]


def split_phonemes(phonemes: list[str], max_phonemes: int) -> list[list[str]]:
    """Cut one sentence's phonemes into pieces of at most `max_phonemes` phonemes each.

    A piece ends at a word break (a space in espeak-ng's phonemes), not inside a word,
    and preferably after clause punctuation (`, ; : . ! ?`) when that leaves a piece at least
    half the bound long; otherwise at the word break nearest to an even division of what is
    left. A piece cut at a bare word break gets a comma appended, so the voice ends it as a
    clause with a comma's pause rather than a sentence's falling close; the pieces' audio is
    then simply concatenated: each starts and ends in the voice's own silence (about 0.03 s
    before and 0.15-0.2 s after), which together give about the 0.2 s pause a comma gives
    inside a sentence, with no click to smooth over. A word longer than the bound (a
    string of letters or digits with no space: the 4,096 letters the speech endpoint
    takes are 2,300 phoneme ids, which in one pass would hold gigabytes) is cut every
    `max_phonemes` phonemes, with nothing appended.

    Args:
        phonemes: one sentence as espeak-ng phonemes (single characters), as
            `sentence_phonemes` gives it.
        max_phonemes: the bound, counted in the sentence's own phonemes.

    Returns:
        The pieces in order; `[phonemes]` when the sentence is within the bound.

    Raises:
        ValueError: `max_phonemes` is below 1.
    """
    if max_phonemes < 1:
        raise ValueError(f"max_phonemes must be at least 1, got {max_phonemes}")
    pieces = []
    start = 0
    while len(phonemes) - start > max_phonemes:
        cut = _best_cut(phonemes, start, max_phonemes)
        if cut is None:
            pieces.append(phonemes[start : start + max_phonemes])
            start += max_phonemes
            continue
        if phonemes[cut - 1] in CLAUSE_PUNCTUATION:
            pieces.append(phonemes[start : cut + 1])
        else:
            pieces.append(phonemes[start:cut] + COMMA_ENDING)
        start = cut + 1
    rest = phonemes[start:]
    if any(phoneme != WORD_BREAK for phoneme in rest):
        pieces.append(rest)
    return pieces


def _best_cut(phonemes: list[str], start: int, max_phonemes: int) -> int | None:
    """Index of the word break that ends the piece starting at `start`; None when the
    piece holds none, being one word longer than the bound."""
    left = len(phonemes) - start
    target = start + left / math.ceil(left / max_phonemes)
    breaks = [
        i
        for i in range(start + 1, start + max_phonemes + 1)
        if phonemes[i] == WORD_BREAK and phonemes[i - 1] != WORD_BREAK
    ]
    clauses = [
        i
        for i in breaks
        if phonemes[i - 1] in CLAUSE_PUNCTUATION and i - start >= max_phonemes // 2
    ]
    if clauses or breaks:
        return min(clauses or breaks, key=lambda i: abs(i - target))
    return None
