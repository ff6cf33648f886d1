"""The token-budget scheduler: which sequences compute how many tokens in the next step.

It touches no arrays. Each step it serves running sequences first, oldest first, then
admits waiting ones in arrival order while the budget, the sequence cap and the KV cache
allow. When the cache cannot hold a running sequence's next tokens, the newest running
sequence is preempted: its blocks are freed and it is recomputed later. Sequences in a step
still in flight (pipeline parallelism, async scheduling) are never preempted, and skipped
unless they run ahead (`Sequence.runs_ahead`); a sequence that finds no newer victim outside
the steps in flight waits instead. This is the
scheduling of vLLM's v1 engine (`vllm/v1/core/sched/scheduler.py`), without its phases:
chunked prefill, prefix-cache hits and decode are one rule (see `Sequence`).

With speculative decoding, a decoding sequence also gets slots for up to
`num_lookahead_tokens` draft tokens when the budget and the cache have room; drafts never
preempt anything. Accepted drafts count as computed when the step completes.

The later choices of one prompt (`n` > 1) fork from the first: once it has computed all
but the prompt's last token, they share its blocks (copy-on-write) and compute only that
last token each, as vLLM's v0 engine did for parallel sampling. A model with recurrent
layers (`recurrent_state`) also hands its state over, which holds one position only: the
first choice's prefill then stops short of its last prompt token while later choices
wait, and a choice forks only while the first stands exactly there, starting from a copy
of its state slot; otherwise it computes its prompt alone.

With `remote_prefill`, a new sequence is admitted with blocks for all its tokens, and all
but its last token (past any prefix-cache hit) are computed elsewhere: it is returned in
`SchedulerOutput.remote`, runs without being scheduled while its KV is in flight, and
joins the batch once `complete_remote_prefill` records the KV's arrival.
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from mlxcel_core.cache.paged import KVCacheManager
from mlxcel_core.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one engine step.

    Attributes:
        max_num_seqs: most sequences running at once (llama-server's `-np`).
        max_num_batched_tokens: most tokens computed in one step, decode and prefill
            together (llama-server's logical batch, `-b`).
        max_prefill_chunk: most prompt tokens of one sequence in one forward pass
            (llama-server's physical batch, `-ub`), so no prompt stalls the running streams
            for longer than one chunk.

    Raises:
        ValueError: a limit is < 1.
    """

    max_num_seqs: int = 1
    max_num_batched_tokens: int = 2048
    max_prefill_chunk: int = 512

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_prefill_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class ScheduledSequence:
    """A sequence and the tokens it computes this step (from `num_computed` on).

    Attributes:
        sequence: the sequence.
        start: its first position computed this step (its `num_computed` when planned).
        num_new_tokens: its tokens computed this step.
        num_lookahead_tokens: KV slots held beyond `num_new_tokens`, for the draft tokens
            it may verify (speculative decoding).
        state_source: the running slot whose recurrent state it starts from, copied into
            its own before the step (a forked choice's first step); None otherwise.
    """

    sequence: Sequence
    start: int
    num_new_tokens: int
    num_lookahead_tokens: int = 0
    state_source: int | None = None


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's plan.

    Attributes:
        scheduled: the sequences to run, oldest first.
        preempted: sequences whose KV was freed to make room; they wait to be recomputed.
        remote: sequences admitted this step whose prompt KV is to be computed elsewhere.
    """

    scheduled: tuple[ScheduledSequence, ...]
    preempted: tuple[Sequence, ...]
    remote: tuple[Sequence, ...] = ()


def _by_age(sequence: Sequence) -> int:
    return sequence.seq_id


class Scheduler:
    """Decides each step's work over a `KVCacheManager`.

    Args:
        config: the step limits.
        kv: the KV cache manager; the scheduler admits, grows and frees sequences there.
        num_lookahead_tokens: most draft tokens a decoding sequence verifies per step
            (0 without speculative decoding).
        remote_prefill: prompts are computed elsewhere (see the module).
        recurrent_state: the model keeps a recurrent state per running slot, which a fork
            copies (see the module).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        *,
        num_lookahead_tokens: int = 0,
        remote_prefill: bool = False,
        recurrent_state: bool = False,
    ) -> None:
        self.config = config
        self.kv = kv
        self.num_lookahead_tokens = num_lookahead_tokens
        self.remote_prefill = remote_prefill
        self.recurrent_state = recurrent_state
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._free_slots = list(range(config.max_num_seqs))

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, sequence: Sequence) -> None:
        """Queue a new sequence behind those already waiting."""
        self.waiting.append(sequence)

    def schedule(self, max_seqs: int | None = None) -> SchedulerOutput:
        """Plan the next step; the KV cache already holds room for every scheduled token.

        Args:
            max_seqs: most sequences in this step (None: no cap but `max_num_seqs`); a
                pipeline caps each step so that the next ones find sequences to run.
        """
        budget = self.config.max_num_batched_tokens
        room = len(self.running) + len(self.waiting) if max_seqs is None else max_seqs
        scheduled: list[ScheduledSequence] = []
        preempted: list[Sequence] = []
        remote: list[Sequence] = []
        fork_parents = self._fork_parents()
        index = 0
        while index < len(self.running) and budget > 0 and len(scheduled) < room:
            sequence = self.running[index]
            if sequence.kv_in_flight or (sequence.in_step and not sequence.runs_ahead):
                index += 1
                continue
            num_new = min(sequence.num_uncomputed, budget, self.config.max_prefill_chunk)
            num_new = self._stop_at_fork_point(sequence, num_new, fork_parents)
            lookahead = self._lookahead(sequence, budget)
            while not self.kv.allocate_slots(
                sequence.seq_id, sequence.num_computed, num_new + lookahead
            ):
                if lookahead:
                    lookahead = 0
                    continue
                victim = self._newest_preemptible()
                if (
                    victim is None
                    or victim.seq_id < sequence.seq_id
                    or (victim is sequence and self._has_newer_in_step(sequence))
                ):
                    index += 1  # it waits for the steps in flight to end and free a victim
                    break
                self._preempt(victim)
                preempted.append(victim)
                if victim is sequence:
                    break
            else:
                scheduled.append(
                    ScheduledSequence(sequence, sequence.num_computed, num_new, lookahead)
                )
                budget -= num_new + lookahead
                index += 1
        # Admitting while preempting would hand the freed blocks to a newer request.
        while (
            not preempted
            and self.waiting
            and budget > 0
            and self._free_slots
            and len(scheduled) < room
        ):
            sequence = self.waiting[0]
            parent = sequence.fork_parent
            if parent is not None and not self._can_fork_from(parent, sequence):
                # The parent ended or was preempted, or (recurrent state) has moved past
                # the prompt's last token: the prefix cache is the way to reuse.
                sequence.fork_parent = parent = None
            if parent is not None and parent.num_computed < sequence.num_prompt_tokens - 1:
                break  # The parent's prefill is under way; its prompt KV is not there yet.
            wanted = min(budget, self.config.max_prefill_chunk)
            offload = parent is None and self.remote_prefill and sequence.num_tokens > 1
            if offload:
                # Blocks for the whole prompt, since its KV arrives all at once.
                wanted = sequence.num_tokens
            state_source = None
            if parent is not None:
                num_cached = self._fork(parent, sequence)
                if self.recurrent_state:
                    state_source = parent.slot
            else:
                num_cached = self.kv.admit(
                    sequence.seq_id,
                    sequence.token_ids,
                    wanted,
                    extra=sequence.cache_salt,
                    spans=sequence.cache_spans,
                    use_cached=sequence.request.use_prefix_cache,
                )
            if num_cached is None:
                break
            self.waiting.popleft()
            self._start(sequence, num_cached)
            if offload and num_cached < sequence.num_tokens - 1:
                sequence.kv_in_flight = True
                remote.append(sequence)
                continue
            num_new = min(sequence.num_uncomputed, wanted, budget)
            num_new = self._stop_at_fork_point(sequence, num_new, fork_parents)
            scheduled.append(
                ScheduledSequence(
                    sequence, sequence.num_computed, num_new, state_source=state_source
                )
            )
            budget -= num_new
        return SchedulerOutput(tuple(scheduled), tuple(preempted), tuple(remote))

    def _fork_parents(self) -> set[Sequence]:
        """Sequences short of their prompt's last token whose later choices wait to fork
        from their recurrent state there (none for a model without one)."""
        if not self.recurrent_state:
            return set()
        return {
            parent
            for sequence in self.waiting
            if (parent := sequence.fork_parent) is not None
            and not parent.status.finished
            and parent.num_computed < sequence.num_prompt_tokens - 1
        }

    @staticmethod
    def _stop_at_fork_point(sequence: Sequence, num_new: int, fork_parents: set[Sequence]) -> int:
        """`num_new` cut so that a parent of waiting choices stops before its prompt's last
        token: its state there is the one they copy."""
        if sequence not in fork_parents:
            return num_new
        return min(num_new, sequence.num_prompt_tokens - 1 - sequence.num_computed)

    def _can_fork_from(self, parent: Sequence, child: Sequence) -> bool:
        """Whether `child` may still fork from `parent`: the parent runs; it still holds
        the blocks the child reads (a sliding window frees those behind the parent's);
        and, with a recurrent state, it has not moved past the prompt's last token. A
        parent in a step in flight stands there once that step is through only if the
        step is ordered before the child's (it `runs_ahead`: the copy reads the state that
        step writes, on the same stream); a pipeline's steps are not, so it waits."""
        if parent.status is not SequenceStatus.RUNNING:
            return False
        if not self.recurrent_state:
            num_shared = child.num_prompt_tokens - 1
            return parent.num_computed < num_shared or self.kv.can_fork(parent.seq_id, num_shared)
        return parent.num_computed < child.num_prompt_tokens - 1 or (
            parent.num_computed == child.num_prompt_tokens - 1
            and (not parent.in_step or parent.runs_ahead)
        )

    @property
    def num_in_flight(self) -> int:
        """Running sequences whose prompt KV is being computed elsewhere."""
        return sum(1 for sequence in self.running if sequence.kv_in_flight)

    def complete_remote_prefill(self, sequence: Sequence) -> None:
        """Record that all but the last of the sequence's tokens now have their KV in its
        blocks; full blocks join the prefix cache and it is scheduled from the next step.

        Raises:
            ValueError: the sequence's KV is not in flight.
        """
        if not sequence.kv_in_flight:
            raise ValueError(f"sequence {sequence.seq_id} has no KV in flight")
        sequence.kv_in_flight = False
        sequence.num_computed = sequence.num_tokens - 1
        self.kv.commit(sequence.seq_id, sequence.token_ids, sequence.num_computed)

    def begin_step(self, output: SchedulerOutput) -> None:
        """Record that the step's tokens are being computed: each sequence's `num_computed`
        moves past them, so that the next step can be planned before this one is read."""
        for item in output.scheduled:
            item.sequence.num_computed = item.start + item.num_new_tokens

    def complete_step(
        self, output: SchedulerOutput, num_accepted: Mapping[int, int] | None = None
    ) -> None:
        """Record that the step's tokens were computed (after `begin_step`); full blocks
        join the prefix cache, up to this step's tokens (not those of later steps in flight).

        Args:
            output: the step's plan.
            num_accepted: draft tokens accepted per `seq_id`, already appended to the
                sequence's tokens; their KV was computed while verifying them.
        """
        accepted = {} if num_accepted is None else num_accepted
        for item in output.scheduled:
            sequence = item.sequence
            if sequence.status is SequenceStatus.RUNNING:
                num_accepted_here = accepted.get(sequence.seq_id, 0)
                sequence.num_computed += num_accepted_here
                computed = item.start + item.num_new_tokens + num_accepted_here
                self.kv.commit(sequence.seq_id, sequence.token_ids, computed)

    def finish(self, sequence: Sequence, status: SequenceStatus) -> None:
        """End a sequence (waiting or running): free its KV and its slot.

        Raises:
            ValueError: `status` is not a finished status.
        """
        if not status.finished:
            raise ValueError(f"status must be a finished status, got {status.name}")
        if sequence.status is SequenceStatus.RUNNING:
            self.running.remove(sequence)
            self._release_slot(sequence)
        elif sequence.status is SequenceStatus.WAITING:
            self.waiting.remove(sequence)
        self.kv.free(sequence.seq_id)
        sequence.kv_in_flight = False
        sequence.status = status

    def _lookahead(self, sequence: Sequence, budget: int) -> int:
        """Draft slots for a decoding sequence: never more than it may still generate
        after this step's token, nor than the step's budget leaves."""
        if not self.num_lookahead_tokens or sequence.num_uncomputed != 1:
            return 0
        return max(0, min(self.num_lookahead_tokens, sequence.num_tokens_left - 1, budget - 1))

    def _fork(self, parent: Sequence, child: Sequence) -> int | None:
        """Share the parent's prompt KV but the last token; None if no block is free for it."""
        num_shared = child.num_prompt_tokens - 1
        self.kv.fork(parent.seq_id, child.seq_id, num_shared)
        if not self.kv.allocate_slots(child.seq_id, num_shared, 1):
            self.kv.free(child.seq_id)
            return None
        child.fork_parent = None
        return num_shared

    def _start(self, sequence: Sequence, num_cached: int) -> None:
        if sequence.first_scheduled_time is None:
            sequence.first_scheduled_time = time.perf_counter()
            sequence.num_cached_tokens = num_cached
        sequence.num_computed = num_cached
        sequence.status = SequenceStatus.RUNNING
        sequence.slot = heapq.heappop(self._free_slots)
        bisect.insort(self.running, sequence, key=_by_age)

    def _preempt(self, sequence: Sequence) -> None:
        self.running.remove(sequence)
        self._release_slot(sequence)
        self.kv.free(sequence.seq_id)
        sequence.num_computed = 0
        sequence.kv_in_flight = False
        sequence.num_draft_computed = None
        sequence.num_preemptions += 1
        sequence.status = SequenceStatus.WAITING
        self.waiting.appendleft(sequence)
        self.num_preemptions += 1

    def _has_newer_in_step(self, sequence: Sequence) -> bool:
        return any(other.in_step and other.seq_id > sequence.seq_id for other in self.running)

    def _newest_preemptible(self) -> Sequence | None:
        """The newest running sequence outside the steps in flight; None when every one is
        in them (a sequence running ahead is scheduled while in one)."""
        return next((sequence for sequence in reversed(self.running) if not sequence.in_step), None)

    def _release_slot(self, sequence: Sequence) -> None:
        if sequence.slot is not None:
            heapq.heappush(self._free_slots, sequence.slot)
            sequence.slot = None
