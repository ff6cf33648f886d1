"""Word error rate, the measure the speech cases hold transcripts to."""

from __future__ import annotations

import re


def words(text: str) -> list[str]:
    """Lower-case words without punctuation ("rain forest" and "rainforest" differ)."""
    return re.findall(r"[a-z0-9']+", text.lower())


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Levenshtein distance over words (substitutions, insertions, deletions), divided by the
    reference's word count."""
    ref, hyp = words(reference), words(hypothesis)
    distances = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, 1):
        previous, distances[0] = distances[0], i
        for j, hyp_word in enumerate(hyp, 1):
            previous, distances[j] = (
                distances[j],
                min(distances[j] + 1, distances[j - 1] + 1, previous + (ref_word != hyp_word)),
            )
    return distances[-1] / max(len(ref), 1)
