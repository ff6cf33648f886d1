"""The reasoning tracker: counting reasoning tokens, the budget that ends the span, the
grammar held back until the answer, rollback; and the budget inside the batching engine."""

from __future__ import annotations

import mlx.core as mx
import pytest
from test_batching_engine import generate_all, make_config, running_engine, token_ids

from mlxcel_core.engine import EngineRequest
from mlxcel_core.reasoning import ReasoningPhase, ReasoningTokens, ReasoningTracker
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.speculative import SpeculativeConfig, SpeculativeMethod

from reasoning_factories import SuccessorModel, chain

VOCAB = 40
EOS = 0
THINK, END_THINK = 10, 11
THINK_TOKENS = ReasoningTokens((THINK,), (END_THINK,))
# A reply of five reasoning tokens, the end marker and a two-token answer.
REASONING = [20, 21, 22, 23, 24]
ANSWER = [30, 31]


def draw(tracker: ReasoningTracker, wanted: int) -> int:
    """`wanted` when the tracker allows it, else the one token it allows (forced)."""
    allowed = tracker.allowed_mask(VOCAB)
    token = wanted if allowed[wanted].item() else int(mx.argmax(allowed).item())
    tracker.advance(token)
    return token


def run(tracker: ReasoningTracker, wanted: list[int]) -> list[int]:
    return [draw(tracker, token) for token in wanted]


def test_without_a_budget_it_only_counts():
    tracker = ReasoningTracker(THINK_TOKENS)
    reply = [THINK, *REASONING, END_THINK, *ANSWER]
    assert run(tracker, reply) == reply
    assert tracker.num_reasoning_tokens == 5
    assert tracker.phase is ReasoningPhase.ANSWER


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_a_spent_budget_forces_the_end_marker(budget):
    tracker = ReasoningTracker(THINK_TOKENS, phase=ReasoningPhase.REASONING, budget=budget)
    out = run(tracker, [*REASONING, *ANSWER])
    assert out[: budget + 1] == [*REASONING[:budget], END_THINK]
    assert tracker.num_reasoning_tokens == budget
    assert tracker.phase is ReasoningPhase.ANSWER


def test_a_budget_counts_from_the_opening_the_model_writes():
    tracker = ReasoningTracker(THINK_TOKENS, budget=2)
    assert run(tracker, [THINK, 20, 21, 22, 30]) == [THINK, 20, 21, END_THINK, 30]


def test_a_multi_token_end_marker_is_forced_whole():
    tokens = ReasoningTokens((THINK,), (5, 6, 7))
    tracker = ReasoningTracker(tokens, phase=ReasoningPhase.REASONING, budget=2)
    assert run(tracker, [20, 21, 22, 23, 24, 30]) == [20, 21, 5, 6, 7, 30]
    assert tracker.num_reasoning_tokens == 2


def test_a_forced_token_is_the_only_one_allowed():
    tracker = ReasoningTracker(THINK_TOKENS, phase=ReasoningPhase.REASONING, budget=0)
    allowed = tracker.allowed_mask(VOCAB).tolist()
    assert allowed == [token == END_THINK for token in range(VOCAB)]
    with pytest.raises(ValueError, match="budget is spent"):
        tracker.advance(20)


class OnlyEven:
    """A stand-in grammar: even tokens only; records its advances."""

    def __init__(self) -> None:
        self.advanced: list[int] = []

    def allowed_mask(self, vocab_size: int) -> mx.array:
        return mx.arange(vocab_size) % 2 == 0

    def advance(self, token_id: int) -> None:
        if token_id % 2:
            raise ValueError(f"odd token {token_id}")
        self.advanced.append(token_id)

    def rollback(self, num_tokens: int) -> None:
        del self.advanced[len(self.advanced) - num_tokens :]


def test_the_grammar_applies_to_the_answer_only():
    grammar = OnlyEven()
    tracker = ReasoningTracker(THINK_TOKENS, phase=ReasoningPhase.REASONING, inner=grammar)
    assert tracker.allowed_mask(VOCAB)[21].item()  # odd, but inside the reasoning
    run(tracker, [21, 23, END_THINK])
    assert not tracker.allowed_mask(VOCAB)[31].item()
    run(tracker, [30, 32])
    assert grammar.advanced == [30, 32]


def test_before_a_span_the_grammar_or_the_opening_marker():
    grammar = OnlyEven()
    tracker = ReasoningTracker(THINK_TOKENS, inner=grammar)
    allowed = tracker.allowed_mask(VOCAB)
    assert allowed[THINK].item() and allowed[30].item() and not allowed[31].item()
    run(tracker, [30])
    assert tracker.phase is ReasoningPhase.ANSWER and grammar.advanced == [30]


def test_rollback_restores_the_count_phase_and_grammar():
    grammar = OnlyEven()
    tracker = ReasoningTracker(
        THINK_TOKENS, phase=ReasoningPhase.REASONING, budget=3, inner=grammar
    )
    run(tracker, [20, 21])
    run(tracker, [22, 23, 30, 32])  # 23 is replaced by the forced end marker
    assert grammar.advanced == [30, 32]
    tracker.rollback(4)
    assert tracker.phase is ReasoningPhase.REASONING
    assert tracker.num_reasoning_tokens == 2 and grammar.advanced == []
    assert run(tracker, [25, 26, 34]) == [25, END_THINK, 34]
    with pytest.raises(ValueError, match="cannot roll back"):
        tracker.rollback(6)


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match="budget must be >= 0"):
        ReasoningTracker(THINK_TOKENS, budget=-1)


class TokenNames:
    """Decodes every token as `<id>` so outputs read as token lists."""

    def add_token(self, token_id: int) -> str:
        return f"<{token_id}>"

    def finalize(self) -> str:
        return ""


def budget_request(budget: int | None, index: int = 0) -> EngineRequest:
    return EngineRequest(
        prompt_ids=(1, THINK),
        sampling=SamplingParams(temperature=0.0),
        generation=GenerationConfig(context_size=48, max_tokens=20, stop_token_ids={EOS}),
        detokenizer=TokenNames(),
        index=index,
        constraint=(
            None
            if budget is None
            else ReasoningTracker(THINK_TOKENS, phase=ReasoningPhase.REASONING, budget=budget)
        ),
    )


@pytest.fixture(scope="module")
def model() -> SuccessorModel:
    return SuccessorModel(chain(THINK, [*REASONING, END_THINK, *ANSWER]), VOCAB, EOS)


def test_each_request_of_a_batch_keeps_its_own_budget(model):
    with running_engine(model, make_config()) as engine:
        outputs = generate_all(engine, [budget_request(b, i) for i, b in enumerate([None, 0, 2])])
    assert [token_ids(o) for o in outputs] == [
        [*REASONING, END_THINK, *ANSWER],
        [END_THINK, *ANSWER],
        [20, 21, END_THINK, *ANSWER],
    ]


def test_the_budget_holds_under_speculative_decoding(model):
    spec = SpeculativeConfig(method=SpeculativeMethod.PROMPT_LOOKUP, num_draft_tokens=4)
    # The prompt repeats the reply, so prompt lookup drafts the reasoning past the budget.
    prompt = (1, THINK, *REASONING, END_THINK, *ANSWER, EOS, THINK)
    request = budget_request(2)
    request = EngineRequest(
        prompt, request.sampling, request.generation, request.detokenizer,
        constraint=request.constraint,
    )  # fmt: skip
    with running_engine(model, make_config(speculative=spec)) as engine:
        (outputs,) = generate_all(engine, [request])
    assert token_ids(outputs) == [20, 21, END_THINK, *ANSWER]
    assert outputs[-1].stats.draft_tokens > 0


# Channel style, as gpt-oss: <|channel|> analysis ... <|end|> <|start|> <|channel|> final ...
CHANNEL, ANALYSIS, END, FRAMING, FINAL = 5, 6, 7, 9, 8
CHANNEL_TOKENS = ReasoningTokens((CHANNEL, ANALYSIS), (END,), (CHANNEL, FINAL))


def test_channel_style_counts_both_analysis_messages_and_finds_the_answer():
    tracker = ReasoningTracker(CHANNEL_TOKENS)
    reply = [CHANNEL, ANALYSIS, 20, 21, END, FRAMING, CHANNEL, ANALYSIS, 22, END]
    run(tracker, [*reply, FRAMING, CHANNEL, FINAL, 30])
    assert tracker.num_reasoning_tokens == 3
    assert tracker.phase is ReasoningPhase.ANSWER


def test_channel_style_budget_spans_every_analysis_message():
    tracker = ReasoningTracker(CHANNEL_TOKENS, budget=3)
    reply = [CHANNEL, ANALYSIS, 20, 21, END, FRAMING, CHANNEL, ANALYSIS, 22, 23, 24]
    out = run(tracker, [*reply, FRAMING, CHANNEL, FINAL, 30])
    assert out == [*reply[:9], END, 24, FRAMING, CHANNEL, FINAL, 30]
    assert tracker.phase is ReasoningPhase.ANSWER


def test_channel_style_grammar_waits_for_the_final_message():
    grammar = OnlyEven()
    tracker = ReasoningTracker(CHANNEL_TOKENS, inner=grammar)
    allowed = tracker.allowed_mask(VOCAB)
    assert allowed[CHANNEL].item() and allowed[30].item() and not allowed[FRAMING].item()
    run(tracker, [CHANNEL])
    assert tracker.allowed_mask(VOCAB).tolist() == [t in (ANALYSIS, FINAL) for t in range(VOCAB)]
    run(tracker, [ANALYSIS, 21, END, FRAMING, CHANNEL, FINAL])
    assert grammar.advanced == [] and not tracker.allowed_mask(VOCAB)[31].item()
    run(tracker, [30])
    assert grammar.advanced == [30]
