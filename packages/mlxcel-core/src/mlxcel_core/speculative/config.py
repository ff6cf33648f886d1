"""Speculative decoding settings."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mlxcel_core.speculative.acceptance import AcceptanceRule


class SpeculativeMethod(StrEnum):
    """Where draft tokens come from."""

    DRAFT_MODEL = "draft_model"
    PROMPT_LOOKUP = "prompt_lookup"


@dataclass(frozen=True)
class SpeculativeConfig:
    """How the engine drafts and verifies.

    Attributes:
        method: a draft model (passed to the engine) or prompt lookup.
        num_draft_tokens: most draft tokens per sequence and step (llama-server's
            `--draft-max`).
        min_draft_tokens: fewer drafts than this are not verified (`--draft-min`).
        draft_p_min: a draft model stops drafting at a token it gives less than this
            probability (`--draft-p-min`); 0 drafts `num_draft_tokens` always.
        acceptance: the rule for sampled (temperature > 0) requests.
        prompt_lookup_min: shortest n-gram prompt lookup matches (tokens).
        prompt_lookup_max: longest n-gram prompt lookup matches (tokens).

    Raises:
        ValueError: a setting is out of range.
    """

    method: SpeculativeMethod = SpeculativeMethod.DRAFT_MODEL
    num_draft_tokens: int = 16
    min_draft_tokens: int = 0
    draft_p_min: float = 0.8
    acceptance: AcceptanceRule = AcceptanceRule.REJECTION
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if not 0 <= self.min_draft_tokens <= self.num_draft_tokens:
            raise ValueError(
                f"min_draft_tokens must be in [0, num_draft_tokens ({self.num_draft_tokens})],"
                f" got {self.min_draft_tokens}"
            )
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise ValueError(f"draft_p_min must be in [0, 1], got {self.draft_p_min}")
        if self.prompt_lookup_min < 1:
            raise ValueError(f"prompt_lookup_min must be >= 1, got {self.prompt_lookup_min}")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(
                f"prompt_lookup_max must be >= prompt_lookup_min ({self.prompt_lookup_min}), "
                f"got {self.prompt_lookup_max}"
            )
