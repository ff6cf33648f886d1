"""Reasoning spans (`<think>…</think>`, channel-style analysis messages): splitting the text,
following the tokens, and the reasoning budget."""

from mlxcel_core.reasoning.budget import ReasoningTokens, ReasoningTracker
from mlxcel_core.reasoning.splitter import (
    ReasoningDelta,
    ReasoningMarkers,
    ReasoningPhase,
    ReasoningSplitter,
)

__all__ = [
    "ReasoningDelta",
    "ReasoningMarkers",
    "ReasoningPhase",
    "ReasoningSplitter",
    "ReasoningTokens",
    "ReasoningTracker",
]
