"""Drawing many requests' tokens at once: the same tokens and streams as drawing each alone."""

import dataclasses

import mlx.core as mx
import pytest

from mlxcel_core.engine.runner import StepLogits
from mlxcel_core.sampling import Sampler, SamplingParams, sample_batch

VOCAB = 300
HISTORY = mx.array([1, 2, 3], dtype=mx.int32)


def draw_alone(samplers: list[Sampler], logits: mx.array) -> list[int]:
    return [sampler(logits[row], HISTORY).item() for row, sampler in enumerate(samplers)]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.9),
        SamplingParams(temperature=1.3, top_k=0, top_p=0.8, min_p=0.0),
        SamplingParams(temperature=0.7, typical_p=0.9, top_n_sigma=2.0),
        SamplingParams(temperature=1.0, samplers=("top_k", "min_p")),
    ],
)
def test_a_batch_draws_each_rows_tokens_and_advances_its_stream_as_alone(params):
    logits = mx.random.normal((6, VOCAB), key=mx.random.key(0)) * 3
    seeds = [dataclasses.replace(params, seed=seed) for seed in range(6)]
    alone = [Sampler(p) for p in seeds]
    batched = [Sampler(p) for p in seeds]
    for _ in range(3):  # later draws show that each stream advanced as it does alone
        expected = draw_alone(alone, logits)
        assert sample_batch(batched, logits).tolist() == expected
    if params.temperature > 0:
        assert len(set(expected)) > 1


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, repeat_penalty=1.1),
        SamplingParams(temperature=0.8, presence_penalty=0.5),
        SamplingParams(temperature=0.8, dry_multiplier=0.8),
        SamplingParams(temperature=0.8, xtc_probability=0.5),
        SamplingParams(temperature=0.8, logit_bias={5: 2.0}),
        SamplingParams(temperature=0.0, typical_p=0.5),
        SamplingParams(temperature=0.0, repeat_penalty=1.2),
    ],
)
def test_chains_that_need_the_history_or_a_row_of_their_own_draw_alone(params):
    assert Sampler(params).batch_group is None


def test_greedy_requests_share_a_group_whatever_their_truncation_settings():
    greedy = Sampler(SamplingParams(temperature=0.0, top_k=5, seed=1))
    other = Sampler(SamplingParams(temperature=0.0, top_p=0.5, min_p=0.2))
    assert greedy.batch_group is not None
    assert greedy.batch_group == other.batch_group


def test_sampled_requests_share_a_group_only_with_the_same_settings():
    first = Sampler(SamplingParams(temperature=0.8, seed=1))
    second = Sampler(SamplingParams(temperature=0.8, seed=2))
    hotter = Sampler(SamplingParams(temperature=0.9, seed=1))
    assert first.batch_group == second.batch_group != hotter.batch_group


def test_samplers_of_different_groups_are_refused():
    samplers = [Sampler(SamplingParams(temperature=0.0)), Sampler(SamplingParams())]
    with pytest.raises(ValueError, match="one batch group"):
        sample_batch(samplers, mx.zeros((2, VOCAB)))


def test_step_logits_reads_rows_across_passes_in_the_order_asked():
    step = StepLogits()
    decode = mx.arange(3 * 4).reshape(3, 1, 4)
    prefill = mx.arange(100, 100 + 2 * 4).reshape(1, 2, 4)
    step.add([0, 2, 3], decode)
    step.add([1], prefill)
    assert step.last([0, 2, 3]).tolist() == decode[:, 0].tolist()
    assert step.last([3, 1, 0]).tolist() == [
        decode[2, 0].tolist(),
        prefill[0, 1].tolist(),
        decode[0, 0].tolist(),
    ]
    assert step.last([2]).tolist() == [decode[1, 0].tolist()]
    assert step.row(1).tolist() == prefill[0].tolist()


def test_streams_carry_on_as_alone_when_the_batch_changes_between_draws():
    logits = mx.random.normal((4, VOCAB), key=mx.random.key(1)) * 3
    seeds = [SamplingParams(temperature=0.9, seed=seed) for seed in range(4)]
    alone = [Sampler(p) for p in seeds]
    batched = [Sampler(p) for p in seeds]
    draws = [
        [0, 1, 2, 3],
        [0, 1, 2, 3],
        [3, 2, 0],  # one row left, the rest reordered
        [2, 0],
        [1, 2, 0, 3],  # the row that left comes back
    ]
    for rows in draws:
        expected = [alone[row](logits[row], HISTORY).item() for row in rows]
        got = sample_batch([batched[row] for row in rows], logits[mx.array(rows)])
        assert got.tolist() == expected
    # A row drawn alone between batches goes on from where its batch left it.
    assert batched[1](logits[1], HISTORY).item() == alone[1](logits[1], HISTORY).item()
    both = [batched[0], batched[1]]
    expected = [alone[0](logits[0], HISTORY).item(), alone[1](logits[1], HISTORY).item()]
    assert sample_batch(both, logits[:2]).tolist() == expected
