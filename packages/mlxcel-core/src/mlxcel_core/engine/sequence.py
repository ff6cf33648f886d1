"""A request's state inside the engine: its tokens, progress through them, and status."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum

from mlxcel_core.adapters import AdapterScales, adapter_cache_salt
from mlxcel_core.cache.paged import KeyedSpan
from mlxcel_core.engine.request import EngineRequest, OutputSink, RequestHandle
from mlxcel_core.engine.runner import PendingToken
from mlxcel_core.request import FinishReason
from mlxcel_core.sampling import Sampler
from mlxcel_core.text_assembler import TextAssembler


class SequenceStatus(IntEnum):
    """Where a sequence is; every status from `FINISHED_STOPPED` on is final."""

    WAITING = 0
    RUNNING = 1
    FINISHED_STOPPED = 2
    FINISHED_LENGTH = 3
    FINISHED_ABORTED = 4

    @property
    def finished(self) -> bool:
        return self >= SequenceStatus.FINISHED_STOPPED


FINISHED_STATUS = {
    FinishReason.STOP: SequenceStatus.FINISHED_STOPPED,
    FinishReason.LENGTH: SequenceStatus.FINISHED_LENGTH,
}


@dataclass(eq=False)
class Sequence:
    """One request being generated.

    The engine's one rule: `num_computed` of its tokens have their KV in the cache (or
    being written by a step in flight), and each step computes some of the rest. When all
    are computed, the last position's logits give the next token. A fresh prompt, a
    prefix-cache hit, chunked prefill, decode and recompute after preemption are all this
    one rule. Its tokens are `token_ids` and then the `pending` ones: sampled by steps still
    on the device, not yet read by the host (async scheduling, see `EngineCore`).

    Attributes:
        seq_id: unique within the engine.
        request: what was asked.
        sink: where its outputs go.
        handle: its group's handle (cancellation).
        sampler: its own sampler chain and random stream.
        text: its stop criteria and detokenized text.
        token_ids: prompt then generated tokens.
        num_computed: leading tokens whose KV is in the cache or being written by a step
            in flight.
        num_cached_tokens: prompt tokens the prefix cache supplied at first admission.
        status: where it is.
        slot: its slot (0 .. max_num_seqs - 1) while running, else None.
        arrival_time: `time.perf_counter()` at submission (seconds).
        first_scheduled_time: when it first ran, or None.
        first_token_time: when its first token was sampled, or None.
        last_token_time: when its latest token was sampled, or None.
        num_preemptions: times its KV was dropped to make room for older requests.
        num_draft_computed: leading tokens whose draft-model KV is in the cache (speculative
            decoding), or None until the draft model has run for it since its (re)start:
            its prefix-cached blocks are then taken to hold draft KV too.
        num_draft_tokens: draft tokens verified for it so far.
        num_accepted_draft_tokens: of those, tokens accepted.
        fork_parent: for a later choice of a group's prompt, the group's first sequence of
            that prompt: it starts by sharing the parent's prompt KV instead of computing
            it (see `Scheduler`); None otherwise, and once started.
        adapter_scales: the LoRA adapter scales it runs with, resolved on arrival; None
            when the model has no unfused adapters.
        kv_in_flight: running, its prompt's KV being computed elsewhere (disaggregated
            prefill, `remote_prefill`): it holds its blocks and slot but is not scheduled.
        steps_in_flight: steps started and not yet read that hold it (pipeline stages
            keep several in flight, async scheduling two): it is not preempted until they
            complete, and scheduled again only if it `runs_ahead`.
        runs_ahead: its next step may start before its steps in flight are read: its next
            input is known (the rest of its prompt) or is its last pending token, and
            nothing in its sampling needs the tokens on the host.
        pending: tokens sampled by its steps in flight, oldest first, not yet appended to
            `token_ids`.
    """

    seq_id: int
    request: EngineRequest
    sink: OutputSink
    handle: RequestHandle
    sampler: Sampler
    text: TextAssembler
    token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0
    num_draft_computed: int | None = None
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    fork_parent: Sequence | None = None
    adapter_scales: AdapterScales | None = None
    kv_in_flight: bool = False
    steps_in_flight: int = 0
    runs_ahead: bool = False
    pending: deque[PendingToken] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.request.prompt_ids)

    @property
    def in_step(self) -> bool:
        """Whether a step in flight holds it."""
        return self.steps_in_flight > 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def token_budget(self) -> int:
        """The most tokens it may generate (`GenerationConfig.token_budget`)."""
        return self.request.generation.token_budget(self.num_prompt_tokens)

    @property
    def num_tokens_left(self) -> int:
        """Tokens it may still generate (its token budget less those generated or pending)."""
        return self.token_budget - self.text.num_generated - len(self.pending)

    @property
    def cache_salt(self) -> tuple[str, ...]:
        """The extra key of its prefix-cache block hashes (its adapter scales)."""
        return adapter_cache_salt(self.adapter_scales)

    @property
    def cache_spans(self) -> tuple[KeyedSpan, ...]:
        """Its prompt images' placeholder runs keyed by content hash, which key the
        prefix-cache hashes of the blocks holding them."""
        return tuple(
            KeyedSpan(image.start, image.stop, image.content_hash) for image in self.request.images
        )

    @property
    def num_uncomputed(self) -> int:
        """Tokens, pending ones included, whose KV is not in the cache yet."""
        return len(self.token_ids) + len(self.pending) - self.num_computed
