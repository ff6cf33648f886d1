"""Speculative decoding: drafters propose tokens, the target verifies them in one pass, and
an acceptance rule keeps the target's output distribution unchanged."""

from mlxcel_core.speculative.acceptance import (
    AcceptanceRule,
    Verdict,
    exact_match,
    num_leading_accepted,
    rejection_sample,
)
from mlxcel_core.speculative.config import SpeculativeConfig, SpeculativeMethod
from mlxcel_core.speculative.drafter import Drafter, DraftProposal, DraftRequest
from mlxcel_core.speculative.prompt_lookup import PromptLookupDrafter, find_continuation

__all__ = [
    "AcceptanceRule",
    "DraftProposal",
    "DraftRequest",
    "Drafter",
    "PromptLookupDrafter",
    "SpeculativeConfig",
    "SpeculativeMethod",
    "Verdict",
    "exact_match",
    "find_continuation",
    "num_leading_accepted",
    "rejection_sample",
]
