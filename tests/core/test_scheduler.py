"""The token-budget scheduler over a real KV cache manager, on CPU, with no model.

Sequences come from small factories; a step is `schedule`, `begin_step`, then
`complete_step`, then a made-up token appended to every sequence whose tokens were all
computed (as sampling does).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import pytest

from mlxcel_core.cache.paged import KVCacheManager
from mlxcel_core.engine import EngineRequest, OutputQueue, RequestHandle
from mlxcel_core.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from mlxcel_core.engine.sequence import Sequence, SequenceStatus
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import Sampler, SamplingParams
from mlxcel_core.text_assembler import TextAssembler

BLOCK_SIZE = 4
GREEDY = SamplingParams(temperature=0.0)


class NullDetokenizer:
    def add_token(self, token_id: int) -> str:
        return ""

    def finalize(self) -> str:
        return ""


def make_sequence(seq_id: int, prompt: Seq[int]) -> Sequence:
    request = EngineRequest(
        prompt_ids=tuple(prompt),
        sampling=GREEDY,
        generation=GenerationConfig(context_size=4096),
        detokenizer=NullDetokenizer(),
    )
    text = TextAssembler(request.detokenizer, request.generation, len(prompt))
    return Sequence(seq_id, request, OutputQueue(), RequestHandle(seq_id), Sampler(GREEDY), text)


def create_sequences(
    num_seqs: int, num_tokens: int, *, first_id: int = 0, prefix: tuple[int, ...] = ()
) -> list[Sequence]:
    """`num_seqs` sequences of `num_tokens` prompt tokens: `prefix`, then unique tokens."""
    return [
        make_sequence(
            seq_id,
            [*prefix, *range(1000 * (seq_id + 1), 1000 * (seq_id + 1) + num_tokens - len(prefix))],
        )
        for seq_id in range(first_id, first_id + num_seqs)
    ]


def make_scheduler(
    *, num_blocks: int = 64, enable_prefix_caching: bool = True, **limits: int
) -> Scheduler:
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=enable_prefix_caching)
    return Scheduler(SchedulerConfig(**limits), kv)


def planned(output: SchedulerOutput) -> dict[int, int]:
    """seq_id -> tokens scheduled, in plan order."""
    return {item.sequence.seq_id: item.num_new_tokens for item in output.scheduled}


def step(scheduler: Scheduler) -> SchedulerOutput:
    """One engine step without a model: plan, compute, sample a made-up token."""
    output = scheduler.schedule()
    scheduler.begin_step(output)
    scheduler.complete_step(output)
    for item in output.scheduled:
        sequence = item.sequence
        if sequence.num_computed == sequence.num_tokens:
            sequence.token_ids.append(50_000 + 100 * sequence.seq_id + sequence.num_generated)
    return output


def add_all(scheduler: Scheduler, sequences: Seq[Sequence]) -> None:
    for sequence in sequences:
        scheduler.add(sequence)


def test_token_budget_caps_each_step():
    scheduler = make_scheduler(max_num_seqs=4, max_num_batched_tokens=16)
    add_all(scheduler, create_sequences(3, 10))
    first = step(scheduler)
    assert planned(first) == {0: 10, 1: 6}
    assert [s.seq_id for s in scheduler.running] == [0, 1]
    assert [s.seq_id for s in scheduler.waiting] == [2]
    # Running first: seq 0 decodes, seq 1 finishes its prompt, seq 2 gets the rest.
    assert planned(step(scheduler)) == {0: 1, 1: 4, 2: 10}
    assert planned(step(scheduler)) == {0: 1, 1: 1, 2: 1}


def test_prefill_chunk_caps_a_prompt_per_step():
    scheduler = make_scheduler(max_num_seqs=2, max_prefill_chunk=8)
    (sequence,) = create_sequences(1, 20)
    scheduler.add(sequence)
    assert [planned(step(scheduler)) for _ in range(4)] == [{0: 8}, {0: 8}, {0: 4}, {0: 1}]
    assert sequence.num_computed == 21 and sequence.num_generated == 2


def test_running_sequences_are_served_before_waiting_ones_oldest_first():
    scheduler = make_scheduler(max_num_seqs=4, max_num_batched_tokens=6)
    add_all(scheduler, create_sequences(2, 3))
    assert planned(step(scheduler)) == {0: 3, 1: 3}
    add_all(scheduler, create_sequences(2, 5, first_id=2))
    output = step(scheduler)
    assert list(planned(output)) == [0, 1, 2]
    assert planned(output) == {0: 1, 1: 1, 2: 4}
    # Seq 2 is now running (its prompt unfinished) and comes before the waiting seq 3.
    assert planned(step(scheduler)) == {0: 1, 1: 1, 2: 1, 3: 3}


def test_a_long_prompt_is_chunked_around_eight_decoding_sequences():
    scheduler = make_scheduler(
        num_blocks=128, max_num_seqs=9, max_num_batched_tokens=16, max_prefill_chunk=16
    )
    decoders = create_sequences(8, 2)
    add_all(scheduler, decoders)
    assert planned(step(scheduler)) == dict.fromkeys(range(8), 2)
    (long_prompt,) = create_sequences(1, 100, first_id=8)
    scheduler.add(long_prompt)
    chunks = []
    while long_prompt.num_computed < long_prompt.num_prompt_tokens:
        output = step(scheduler)
        plan = planned(output)
        assert {seq_id: plan[seq_id] for seq_id in range(8)} == dict.fromkeys(range(8), 1)
        assert sum(plan.values()) <= 16
        chunks.append(plan[8])
    assert chunks == [8] * 12 + [4]
    assert all(d.num_generated == 1 + len(chunks) for d in decoders)


def test_max_num_seqs_caps_running_sequences_and_slots():
    scheduler = make_scheduler(max_num_seqs=2)
    add_all(scheduler, create_sequences(5, 3))
    assert planned(step(scheduler)) == {0: 3, 1: 3}
    assert [s.seq_id for s in scheduler.running] == [0, 1]
    assert [s.seq_id for s in scheduler.waiting] == [2, 3, 4]
    assert sorted(s.slot for s in scheduler.running) == [0, 1]
    assert planned(step(scheduler)) == {0: 1, 1: 1}


def test_a_waiting_sequence_that_does_not_fit_blocks_newer_ones():
    # 4 usable blocks: seq 0 holds 2, seq 1 needs 3, seq 2 would fit in 1.
    scheduler = make_scheduler(num_blocks=5, max_num_seqs=4)
    scheduler.add(make_sequence(0, range(8)))
    assert planned(step(scheduler)) == {0: 8}
    scheduler.add(make_sequence(1, range(100, 112)))
    scheduler.add(make_sequence(2, range(200, 202)))
    assert planned(step(scheduler)) == {0: 1}
    assert [s.seq_id for s in scheduler.waiting] == [1, 2]
    scheduler.finish(scheduler.running[0], SequenceStatus.FINISHED_STOPPED)
    assert planned(step(scheduler)) == {1: 12, 2: 2}


def test_the_newest_running_sequence_is_preempted_and_recomputed_later():
    # 6 usable blocks; two 8-token prompts need 4, then grow a block every 4 tokens.
    scheduler = make_scheduler(num_blocks=7, max_num_seqs=2, enable_prefix_caching=False)
    old, new = create_sequences(2, 8)
    (third,) = create_sequences(1, 2, first_id=2)
    add_all(scheduler, [old, new, third])
    assert planned(step(scheduler)) == {0: 8, 1: 8}
    for _ in range(4):  # positions 8..11: a third block each, 6 blocks in all
        assert planned(step(scheduler)) == {0: 1, 1: 1}
    assert scheduler.kv.num_free_blocks == 0
    output = step(scheduler)  # position 12 needs a 4th block: the newer sequence yields
    assert planned(output) == {0: 1}
    assert output.preempted == (new,)
    assert new.status is SequenceStatus.WAITING and new.slot is None
    assert (new.num_computed, new.num_preemptions, scheduler.num_preemptions) == (0, 1, 1)
    assert [s.seq_id for s in scheduler.waiting] == [1, 2]
    assert new.num_tokens == 13  # its sampled tokens are kept, to be recomputed
    # The preempted sequence needs 4 blocks; only 2 are free, and FIFO holds the third back.
    assert planned(step(scheduler)) == {0: 1}
    scheduler.finish(old, SequenceStatus.FINISHED_LENGTH)
    assert planned(step(scheduler)) == {1: 13, 2: 2}
    assert new.num_computed == 13 and new.num_tokens == 14
    assert scheduler.num_preemptions == 1


def test_a_sequence_in_a_step_in_flight_is_neither_scheduled_nor_preempted():
    # As above, 6 usable blocks; the newer sequence is in a step still in flight.
    scheduler = make_scheduler(num_blocks=7, max_num_seqs=2, enable_prefix_caching=False)
    old, new = create_sequences(2, 8)
    add_all(scheduler, [old, new])
    for _ in range(5):
        step(scheduler)
    assert scheduler.kv.num_free_blocks == 0
    new.steps_in_flight = 1
    # The older one needs a 4th block: it waits for the newer one's step, not preempting
    # the newer one or itself.
    output = step(scheduler)
    assert (planned(output), output.preempted) == ({}, ())
    assert old.status is new.status is SequenceStatus.RUNNING
    new.steps_in_flight = 0
    output = step(scheduler)
    assert (planned(output), output.preempted) == ({0: 1}, (new,))


def test_max_seqs_caps_one_step_and_leaves_the_rest_to_the_next():
    scheduler = make_scheduler(max_num_seqs=4)
    sequences = create_sequences(4, 3)
    add_all(scheduler, sequences)
    first = scheduler.schedule(max_seqs=2)
    assert planned(first) == {0: 3, 1: 3}
    for item in first.scheduled:
        item.sequence.steps_in_flight = 1
    assert planned(scheduler.schedule(max_seqs=2)) == {2: 3, 3: 3}


def test_preemption_of_the_only_fitting_sequence_stops_admission_for_the_step():
    scheduler = make_scheduler(num_blocks=5, max_num_seqs=3, enable_prefix_caching=False)
    add_all(scheduler, create_sequences(2, 8))
    assert planned(step(scheduler)) == {0: 8, 1: 8}
    scheduler.add(make_sequence(9, [7]))
    output = step(scheduler)
    # Seq 0 needs a third block; seq 1 is preempted, and the freed blocks are not handed to
    # the new arrival in the same step.
    assert planned(output) == {0: 1}
    assert [s.seq_id for s in output.preempted] == [1]
    assert [s.seq_id for s in scheduler.waiting] == [1, 9]


def test_prefix_cache_hit_sets_num_computed_and_num_cached_tokens():
    scheduler = make_scheduler(max_num_seqs=2)
    shared = tuple(range(500, 508))
    (first,) = create_sequences(1, 10, prefix=shared)
    scheduler.add(first)
    assert planned(step(scheduler)) == {0: 10}
    scheduler.finish(first, SequenceStatus.FINISHED_STOPPED)
    (second,) = create_sequences(1, 11, first_id=1, prefix=shared)
    scheduler.add(second)
    assert planned(step(scheduler)) == {1: 3}
    assert second.num_cached_tokens == 8 and second.num_computed == 11
    assert scheduler.kv.num_hit_tokens == 8


def test_a_full_prompt_hit_still_computes_its_last_token():
    scheduler = make_scheduler(max_num_seqs=2)
    scheduler.add(make_sequence(0, range(8)))
    step(scheduler)
    scheduler.add(make_sequence(1, range(8)))
    assert planned(step(scheduler)) == {0: 1, 1: 4}
    assert scheduler.running[1].num_cached_tokens == 4


def test_finish_frees_blocks_and_slots_and_slots_are_reused_lowest_first():
    scheduler = make_scheduler(max_num_seqs=3, enable_prefix_caching=False)
    sequences = create_sequences(3, 5)
    add_all(scheduler, sequences)
    step(scheduler)
    assert [s.slot for s in sequences] == [0, 1, 2]
    assert scheduler.kv.num_used_blocks == 6
    scheduler.finish(sequences[1], SequenceStatus.FINISHED_STOPPED)
    scheduler.finish(sequences[0], SequenceStatus.FINISHED_ABORTED)
    assert (sequences[0].slot, sequences[1].slot) == (None, None)
    assert sequences[1].status is SequenceStatus.FINISHED_STOPPED
    assert scheduler.kv.num_used_blocks == 2
    newcomers = create_sequences(2, 3, first_id=3)
    add_all(scheduler, newcomers)
    step(scheduler)
    assert [s.slot for s in newcomers] == [0, 1]
    assert [s.seq_id for s in scheduler.running] == [2, 3, 4]


def test_finishing_a_waiting_sequence_removes_it_from_the_queue():
    scheduler = make_scheduler(max_num_seqs=1)
    first, second = create_sequences(2, 3)
    add_all(scheduler, [first, second])
    step(scheduler)
    scheduler.finish(second, SequenceStatus.FINISHED_ABORTED)
    assert not scheduler.waiting and scheduler.running == [first]
    scheduler.finish(first, SequenceStatus.FINISHED_STOPPED)
    assert not scheduler.has_work and scheduler.kv.num_used_blocks == 0
    with pytest.raises(ValueError, match="finished status"):
        scheduler.finish(first, SequenceStatus.RUNNING)


def test_scheduler_config_validates_its_limits():
    with pytest.raises(ValueError, match="max_prefill_chunk must be >= 1, got 0"):
        SchedulerConfig(max_prefill_chunk=0)


# Recurrent state: a fork copies the first choice's state at the prompt's last token


def make_recurrent_scheduler(**limits: int) -> Scheduler:
    kv = KVCacheManager(64, BLOCK_SIZE, enable_prefix_caching=False)
    return Scheduler(SchedulerConfig(**limits), kv, recurrent_state=True)


def make_choices(prompt_length: int, num_choices: int) -> list[Sequence]:
    prompt = list(range(100, 100 + prompt_length))
    choices = [make_sequence(seq_id, prompt) for seq_id in range(num_choices)]
    for child in choices[1:]:
        child.fork_parent = choices[0]
    return choices


def test_a_recurrent_first_choice_stops_before_the_last_prompt_token_for_its_forks():
    scheduler = make_recurrent_scheduler(max_num_seqs=4, max_prefill_chunk=16)
    parent, *children = make_choices(10, 3)
    add_all(scheduler, [parent, *children])
    # The prompt fits one chunk, but the parent stops at 9 tokens: its state there is the
    # one its choices start from.
    first = step(scheduler)
    assert planned(first) == {0: 9}
    second = step(scheduler)
    assert planned(second) == {0: 1, 1: 1, 2: 1}
    sources = {item.sequence.seq_id: item.state_source for item in second.scheduled}
    assert sources == {0: None, 1: parent.slot, 2: parent.slot}
    assert [child.num_cached_tokens for child in children] == [9, 9]


def test_a_recurrent_choice_that_misses_the_fork_point_computes_its_prompt_alone():
    scheduler = make_recurrent_scheduler(max_num_seqs=1, max_prefill_chunk=16)
    parent, child = make_choices(10, 2)
    add_all(scheduler, [parent, child])
    assert planned(step(scheduler)) == {0: 9}
    # No free slot for the child at the fork point: the parent moves on without it.
    assert planned(step(scheduler)) == {0: 1}
    while parent.status is SequenceStatus.RUNNING:
        output = step(scheduler)
        if parent.num_generated >= 3:
            scheduler.finish(parent, SequenceStatus.FINISHED_LENGTH)
    output = step(scheduler)
    assert planned(output) == {1: 10}
    assert output.scheduled[0].state_source is None
    assert child.fork_parent is None


def test_without_recurrent_state_choices_fork_at_once_and_copy_no_state():
    scheduler = make_scheduler(max_num_seqs=4, max_prefill_chunk=16)
    parent, *children = make_choices(10, 3)
    add_all(scheduler, [parent, *children])
    assert planned(step(scheduler)) == {0: 10}
    second = step(scheduler)
    assert planned(second) == {0: 1, 1: 1, 2: 1}
    assert all(item.state_source is None for item in second.scheduled)
