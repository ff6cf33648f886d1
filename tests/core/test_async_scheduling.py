"""Async scheduling against the synchronous loop, stepping `EngineCore` with no threads.

Every case runs the same requests through an `EngineCore` with `async_scheduling` on and
off (`engine_core_runs`) and compares each request's outputs token by token: token ids,
text, log probabilities, finish reasons and errors. Most run on the tiny float32 llama;
the cache kinds run on tiny mlx-lm models (`cache_kind_models`): recurrent states (a
state read while its row's token is still on the device, forks that copy a state slot),
windowed layers freeing blocks while a step that read them may be in flight, and a block
group of their own beside full attention.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxcel_core.engine import (
    EngineCore,
    EngineOutput,
    OutputQueue,
    RequestCancelledError,
    RequestHandle,
    Submission,
)
from mlxcel_core.engine.runner import PendingToken, RowInput, pass_tokens
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.request import FinishReason
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.speculative import SpeculativeConfig
from mlxcel_models.loading.loader import load_model

from cache_kind_models import make_model
from engine_core_runs import (
    Arrival,
    assert_same_outputs,
    comparable,
    config,
    prompt,
    request,
    run,
)


class ThirdsConstraint:
    """Allows, at the n-th token, only ids congruent to n mod 3: wrong tokens follow if the
    engine samples a token before the constraint has seen the ones before it."""

    def __init__(self) -> None:
        self.count = 0

    def allowed_mask(self, vocab_size: int) -> mx.array:
        return mx.arange(vocab_size) % 3 == self.count % 3

    def advance(self, token_id: int) -> None:
        self.count += 1

    def rollback(self, num_tokens: int) -> None:
        self.count -= num_tokens


@pytest.fixture(scope="module")
def model(tiny_safetensors) -> LanguageModel:
    return load_model(tiny_safetensors).model


def test_greedy_requests_arriving_over_time_give_the_same_tokens(model):
    arrivals = [
        Arrival((request(prompt(1, 3)),)),
        Arrival((request(prompt(2, 19), max_tokens=9),)),
        Arrival((request(prompt(3, 5), max_tokens=1),), at_step=2),
        Arrival((request(prompt(4, 11), max_tokens=15),), at_step=3),
        Arrival((request(prompt(5, 1)),), at_step=3),
        Arrival((request(prompt(6, 7)),), at_step=9),
    ]
    _, result = assert_same_outputs(model, arrivals)
    lengths = [sum(o.token_id is not None for o in outputs) for outputs in result.outputs.values()]
    assert lengths == [12, 9, 1, 15, 12, 12]  # no token after the last one leaked out


def test_seeded_sampling_penalties_and_logprobs_give_the_same_tokens(model):
    seeded = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    truncated = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=11)
    penalised = SamplingParams(temperature=0.8, repeat_penalty=1.3, presence_penalty=0.5, seed=3)
    arrivals = [
        Arrival((request(prompt(1, 6), sampling=seeded),)),
        Arrival((request(prompt(2, 9), sampling=truncated),)),
        Arrival((request(prompt(3, 4), sampling=penalised, max_tokens=20),)),
        Arrival((request(prompt(4, 5), num_top_logprobs=3),), at_step=1),
        Arrival((request(prompt(5, 5), sampling=seeded, num_top_logprobs=2),), at_step=4),
    ]
    assert_same_outputs(model, arrivals)


def test_stop_strings_and_stop_tokens_end_at_the_same_token(model):
    reference_outputs = run(
        model, config(False), [Arrival((request(prompt(1, 6), max_tokens=20),))]
    ).outputs[0]
    tokens = [o.token_id for o in reference_outputs if o.token_id is not None]
    text = "".join(o.text for o in reference_outputs)
    stop = text[5:7]
    arrivals = [
        Arrival((request(prompt(1, 6), max_tokens=20, stop_strings=(stop,)),)),
        Arrival((request(prompt(1, 6), max_tokens=20, stop_token_ids=frozenset({tokens[3]})),)),
        Arrival((request(prompt(2, 8), max_tokens=20),)),
    ]
    _, result = assert_same_outputs(model, arrivals)
    assert result.outputs[0][-1].finish_reason is FinishReason.STOP
    assert result.outputs[100][-1].finish_reason is FinishReason.STOP


def test_cancelled_requests_end_and_the_others_give_the_same_tokens(model):
    arrivals = [
        Arrival((request(prompt(1, 6), max_tokens=30),), cancel_at_step=5),
        Arrival((request(prompt(2, 9), max_tokens=14),)),
        Arrival((request(prompt(3, 3), max_tokens=30),), at_step=2, cancel_at_step=2),
    ]
    synchronous = run(model, config(False), arrivals)
    overlapped = run(model, config(True), arrivals)
    assert comparable(overlapped.outputs[100]) == comparable(synchronous.outputs[100])
    full = run(model, config(False), [Arrival((request(prompt(1, 6), max_tokens=30),))])
    full_tokens = [o.token_id for o in full.outputs[0] if o.token_id is not None]
    for result in (synchronous, overlapped):
        for key in (0, 200):
            outputs = result.outputs[key]
            assert isinstance(outputs[-1].error, RequestCancelledError)
        tokens = [o.token_id for o in result.outputs[0] if o.token_id is not None]
        assert 0 < len(tokens) < 30 and tokens == full_tokens[: len(tokens)]


def test_preemption_gives_the_same_tokens(model):
    # 11 usable blocks of 4 for four sequences that grow to 6-8 blocks each: preemptions.
    arrivals = [
        Arrival((request(prompt(i, 9 + 3 * i), max_tokens=12, context_size=32),), at_step=i)
        for i in range(4)
    ]
    runs = assert_same_outputs(model, arrivals, num_kv_blocks=12, context_size=32)
    for result in runs:
        assert result.num_preemptions > 0
        assert all(o[-1].finish_reason is FinishReason.LENGTH for o in result.outputs.values())


def test_parallel_choices_of_one_prompt_give_the_same_tokens(model):
    sampled = SamplingParams(temperature=0.9, seed=5)
    group = tuple(
        request(prompt(1, 10), sampling=sampled, index=i, max_tokens=8 + i) for i in range(3)
    )
    arrivals = [Arrival(group), Arrival((request(prompt(2, 5)),), at_step=1)]
    _, result = assert_same_outputs(model, arrivals)
    assert sorted(result.outputs) == [0, 1, 2, 100]


def test_a_constrained_row_reads_its_tokens_before_its_next_step(model):
    arrivals = [
        Arrival((request(prompt(1, 6), constraint=ThirdsConstraint()),)),
        Arrival((request(prompt(2, 6)),)),
    ]
    constrained = SamplingParams(temperature=0.0, dry_multiplier=0.8, seed=1)
    dry = [Arrival((request(prompt(3, 12), sampling=constrained, max_tokens=16),))]
    _, result = assert_same_outputs(model, arrivals)
    tokens = [o.token_id for o in result.outputs[0] if o.token_id is not None]
    assert [token % 3 for token in tokens] == [n % 3 for n in range(len(tokens))]
    assert_same_outputs(model, dry)


def test_speculative_decoding_runs_synchronously_with_the_same_tokens(model):
    speculative = SpeculativeConfig(num_draft_tokens=3, prompt_lookup_min=1)
    repetitive = [3, 4, 5, 6] * 4
    arrivals = [Arrival((request(repetitive),)), Arrival((request(prompt(2, 7)),))]
    assert_same_outputs(model, arrivals, speculative=speculative)
    core = EngineCore(model, config(True, speculative=speculative))
    assert not core.runs_ahead


# EngineCore steps, without threads


def test_overlapped_core_reads_each_step_one_step_later(model):
    core = EngineCore(model, config(True))
    assert core.runs_ahead
    sink = OutputQueue()
    core.admit(Submission(0, request(prompt(1, 3), max_tokens=3), sink, RequestHandle(0)), {})
    outputs = []

    def step() -> list[EngineOutput]:
        core.step()
        new = []
        while True:
            try:
                new.append(sink.get(timeout=0))
            except Exception:
                return new

    outputs = [step() for _ in range(4)]
    assert [len(new) for new in outputs] == [0, 1, 1, 2]  # the 3rd token, then the terminal
    assert outputs[-1][-1].finish_reason is FinishReason.LENGTH
    assert not core.has_work


def test_synchronous_core_reads_each_step_before_the_next(model):
    core = EngineCore(model, config(False))
    assert not core.runs_ahead
    sink = OutputQueue()
    core.admit(Submission(0, request(prompt(1, 3), max_tokens=2), sink, RequestHandle(0)), {})
    core.step()
    assert sink.get(timeout=0).token_id is not None
    core.step()
    assert sink.get(timeout=0).token_id is not None
    assert sink.get(timeout=0).finish_reason is FinishReason.LENGTH
    assert not core.has_work


def test_pass_tokens_reads_pending_tokens_on_the_device():
    first = mx.array([11, 12, 13], dtype=mx.int32)
    second = mx.array([21], dtype=mx.int32)
    tables = ([1, 2],)

    def row(token: int, pending: PendingToken | None = None) -> RowInput:
        return RowInput([token], tables, 4, pending=pending)

    whole = [row(0, PendingToken(first, i)) for i in range(3)]
    assert pass_tokens(whole).tolist() == [[11], [12], [13]]
    mixed = [
        row(0, PendingToken(first, 2)),
        row(7),
        row(0, PendingToken(second, 0)),
        row(0, PendingToken(first, 0)),
    ]
    assert pass_tokens(mixed).tolist() == [[13], [7], [21], [11]]
    assert pass_tokens([row(5), row(6)]).tolist() == [[5], [6]]
    with pytest.raises(ValueError, match="pending token has one token"):
        RowInput([0, 1], tables, 4, pending=PendingToken(first, 0))


# Cache kinds: recurrent states, windows freeing blocks, a window block group

KIND_VOCAB_SIZE = 64


def sampled(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.9, seed=seed)


@pytest.mark.parametrize("name", ["jamba", "recurrent_gemma", "gemma3_text"])
def test_state_and_window_models_give_the_same_tokens(name):
    """Jamba (Mamba states beside attention), RecurrentGemma (RG-LRU states, attention
    over a window of 8 whose blocks are freed as rows move on) and Gemma 3 (a window
    block group beside full attention): prompts longer than the window, decode rows
    running ahead with their states, seeded draws, a stop string, a group of two
    choices forking from the first one's state and KV, and a cancellation."""
    model = make_model(name)

    def tokens(first: int, length: int) -> list[int]:
        return prompt(first, length, KIND_VOCAB_SIZE)

    arrivals = [
        Arrival((request(tokens(1, 13), max_tokens=24),)),
        Arrival((request(tokens(2, 5), sampling=sampled(3), max_tokens=16),)),
        Arrival(
            tuple(
                request(tokens(3, 11), sampling=sampled(seed), index=i, max_tokens=12)
                for i, seed in enumerate((1, 2))
            ),
            at_step=2,
        ),
        Arrival((request(tokens(4, 9), max_tokens=20, stop_strings=("q",)),), at_step=3),
        Arrival((request(tokens(5, 7), max_tokens=30),), at_step=4, cancel_at_step=9),
    ]
    runs = assert_same_outputs(model, arrivals)
    for result in runs:
        forked = result.outputs[201][-1]
        assert forked.stats.cached_tokens == 10  # the second choice forked from the first
        assert isinstance(result.outputs[400][-1].error, RequestCancelledError)


@pytest.mark.parametrize(
    ("name", "num_blocks"), [("mamba2", 12), ("recurrent_gemma", 8), ("gemma3_text", 12)]
)
def test_preempted_state_and_window_models_give_the_same_tokens(name, num_blocks):
    """Four sequences growing past what the cache holds (RecurrentGemma's windows hold
    about 4 blocks each): preemptions, each restarting its state."""
    model = make_model(name)
    arrivals = [
        Arrival(
            (request(prompt(i, 9 + 3 * i, KIND_VOCAB_SIZE), max_tokens=14, context_size=32),),
            at_step=i,
        )
        for i in range(4)
    ]
    runs = assert_same_outputs(model, arrivals, num_kv_blocks=num_blocks, context_size=32)
    for result in runs:
        assert result.num_preemptions > 0
        assert all(o[-1].finish_reason is FinishReason.LENGTH for o in result.outputs.values())
