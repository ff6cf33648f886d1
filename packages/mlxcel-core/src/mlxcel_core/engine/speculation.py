"""The engine's side of speculative decoding: its drafter, and each step's proposals."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcel_core.cache.paged import KVCacheManager, PagedKVStorage
from mlxcel_core.engine.draft_model import DraftModelDrafter
from mlxcel_core.engine.kv_plan import KVCachePlan
from mlxcel_core.engine.memory import ModelProfile
from mlxcel_core.engine.scheduler import ScheduledSequence
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.speculative import (
    Drafter,
    DraftProposal,
    DraftRequest,
    PromptLookupDrafter,
    SpeculativeConfig,
)


class Speculation:
    """A drafter and the settings it drafts under.

    Args:
        config: the speculative decoding settings.
        drafter: the drafter they name.
    """

    def __init__(self, config: SpeculativeConfig, drafter: Drafter) -> None:
        self.config = config
        self.drafter = drafter

    def propose(
        self, scheduled: Sequence[ScheduledSequence], kv: KVCacheManager
    ) -> list[DraftProposal]:
        """Each scheduled sequence's drafts, within the lookahead slots it holds.

        Every sequence is passed to the drafter (a draft model keeps its KV level with the
        target's); a proposal shorter than `min_draft_tokens` is dropped. Records each
        sequence's draft-model progress.
        """
        requests = []
        for item in scheduled:
            sequence = item.sequence
            computed = sequence.num_computed
            draft_computed = sequence.num_draft_computed
            requests.append(
                DraftRequest(
                    token_ids=sequence.token_ids,
                    block_tables=kv.block_tables(sequence.seq_id),
                    num_target_computed=computed + item.num_new_tokens,
                    num_draft_computed=(
                        computed if draft_computed is None else min(draft_computed, computed)
                    ),
                    num_draft_tokens=item.num_lookahead_tokens,
                    sampler=sequence.sampler,
                )
            )
        proposals = self.drafter.propose(requests)
        for item, proposal in zip(scheduled, proposals, strict=True):
            item.sequence.num_draft_computed = proposal.num_draft_computed
        return [
            proposal
            if len(proposal.token_ids) >= self.config.min_draft_tokens
            else DraftProposal((), None, proposal.num_draft_computed)
            for proposal in proposals
        ]


def make_speculation(
    config: SpeculativeConfig,
    draft: tuple[LanguageModel, ModelProfile] | None,
    *,
    block_size: int,
    plan: KVCachePlan,
) -> tuple[Speculation, PagedKVStorage | None]:
    """The speculation `config` asks for, and the draft model's KV pools when it has one.

    Args:
        draft: the draft model and its profile, for the draft-model method.
        block_size: tokens per KV block, the target's.
        plan: the target's KV cache: the draft's pools share its block groups and ids.
    """
    if draft is None:
        drafter = PromptLookupDrafter(
            min_ngram=config.prompt_lookup_min, max_ngram=config.prompt_lookup_max
        )
        return Speculation(config, drafter), None
    model, profile = draft
    storage = PagedKVStorage(
        profile.layers,
        block_size,
        plan.num_blocks,
        layer_groups=plan.draft_layer_groups,
        windows=plan.groups.windows,
    )
    drafter = DraftModelDrafter(model, storage, p_min=config.draft_p_min)
    return Speculation(config, drafter), storage
