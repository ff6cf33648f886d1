"""Neutral filler text for long-prompt cases: sentences a hidden code can sit among."""

from __future__ import annotations

SENTENCES = (
    "The library opens at nine.",
    "Rain is expected on Tuesday.",
    "The train was late again.",
    "Apples grow well in cool climates.",
    "The meeting moved to room four.",
    "A new bakery opened downtown.",
    "The river is calm in the morning.",
    "Tickets sold out in an hour.",
    "The bridge was painted green.",
    "Owls hunt at night.",
    "The museum has a new exhibit.",
    "Snow fell in the mountains.",
)


def filler(num_sentences: int, start: int = 0) -> str:
    """`num_sentences` sentences, cycling through `SENTENCES` from `start`."""
    return " ".join(SENTENCES[(start + i) % len(SENTENCES)] for i in range(num_sentences))
