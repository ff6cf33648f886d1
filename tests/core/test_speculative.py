"""Speculative decoding: the acceptance rules keep the target distribution, and inside the
engine drafts never change what greedy decoding, penalties, logit bias, constraints,
preemption or the prefix cache produce.

The engine cases run the tiny float32 llama as its own draft (every draft should pass), a
one-layer copy of it (few drafts pass) and prompt lookup, against plain decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np
import pytest
from test_batching_engine import (
    GREEDY,
    generate_all,
    generate_alone,
    make_config,
    make_prompts,
    make_request,
    running_engine,
    token_ids,
)

from mlxcel_core.engine import Engine, EngineConfig, EngineOutput, EngineRequest
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.speculative import (
    AcceptanceRule,
    SpeculativeConfig,
    SpeculativeMethod,
    Verdict,
    exact_match,
    find_continuation,
    num_leading_accepted,
    rejection_sample,
)
from mlxcel_models.loading.loader import load_model

# Chi-square critical value at p = 0.01 for 4 degrees of freedom (5 categories).
CHI2_CRITICAL_4_DOF = 13.277
TARGET = np.array(
    [[0.5, 0.2, 0.15, 0.1, 0.05], [0.1, 0.4, 0.1, 0.1, 0.3], [0.2, 0.2, 0.2, 0.2, 0.2]],
    dtype=np.float32,
)
DRAFT = np.array([[0.05, 0.1, 0.15, 0.2, 0.5], [0.3, 0.1, 0.3, 0.2, 0.1]], dtype=np.float32)
LONG_GENERATION = GenerationConfig(context_size=48, max_tokens=24)


# The acceptance rules on a toy target and draft with known distributions


def resample_from_target_on_rejection(
    target_probs: mx.array, drafts: mx.array, draft_probs: mx.array, key: mx.array
) -> Verdict:
    """A wrong rule: after a rejection it draws from p instead of norm(max(p - q, 0)),
    which over-weights the tokens the draft already favours."""
    k = drafts.shape[0]
    accept_key, draw_key = mx.random.split(key)
    p_draft = mx.take_along_axis(target_probs[:k], drafts[:, None], axis=1)[:, 0]
    q_draft = mx.take_along_axis(draft_probs, drafts[:, None], axis=1)[:, 0]
    accepted = mx.random.uniform(shape=(k,), key=accept_key) * q_draft < p_draft
    tokens = mx.random.categorical(mx.log(target_probs), axis=-1, key=draw_key)
    return Verdict(accepted, tokens.astype(mx.int32))


def target_sampling(target_probs, drafts, draft_probs, key) -> Verdict:
    """The `EXACT` rule, with the target's draws made from `key`."""
    draws = mx.random.categorical(mx.log(target_probs), axis=-1, key=key)
    return exact_match(draws.astype(mx.int32), drafts)


def emitted_counts(rule, num_trials: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    """Counts of the first emitted token, and of the second where a first draft passed."""
    rng = np.random.default_rng(0)
    target, draft = mx.array(TARGET), mx.array(DRAFT)
    first, second = np.zeros(5), np.zeros(5)
    for trial in range(num_trials):
        drafts = [rng.choice(5, p=DRAFT[j] / DRAFT[j].sum()) for j in range(2)]
        verdict = rule(target, mx.array(drafts, dtype=mx.int32), draft, mx.random.key(trial))
        num_accepted = num_leading_accepted(verdict.accepted.tolist())
        emitted = [*drafts[:num_accepted], verdict.tokens.tolist()[num_accepted]]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    return first, second


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("rule", [rejection_sample, target_sampling], ids=["rejection", "exact"])
def test_acceptance_rules_emit_the_target_distribution(rule):
    first, second = emitted_counts(rule)
    assert chi_square(first, TARGET[0]) < CHI2_CRITICAL_4_DOF
    assert second.sum() > 300
    assert chi_square(second, TARGET[1]) < CHI2_CRITICAL_4_DOF


def test_a_wrong_rule_fails_the_same_test():
    first, _ = emitted_counts(resample_from_target_on_rejection)
    assert chi_square(first, TARGET[0]) > CHI2_CRITICAL_4_DOF


def test_rejection_accepts_more_than_exact_matching_when_sampling():
    first_rejection = sum(
        num_leading_accepted(
            rejection_sample(
                mx.array(TARGET), mx.array([0, 1]), mx.array(DRAFT), mx.random.key(seed)
            ).accepted.tolist()
        )
        for seed in range(300)
    )
    first_exact = sum(
        num_leading_accepted(
            target_sampling(
                mx.array(TARGET), mx.array([0, 1]), mx.array(DRAFT), mx.random.key(seed)
            ).accepted.tolist()
        )
        for seed in range(300)
    )
    assert first_rejection > first_exact


def test_deterministic_drafts_are_rejected_only_by_target_probability():
    # A one-hot draft of the target's only token always passes; of an impossible one, never.
    target = mx.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    passing = rejection_sample(target, mx.array([1]), None, mx.random.key(0))
    failing = rejection_sample(target, mx.array([0]), None, mx.random.key(0))
    assert passing.accepted.tolist() == [True] and passing.tokens.tolist()[1] == 2
    assert failing.accepted.tolist() == [False] and failing.tokens.tolist()[0] == 1


# Prompt lookup


def test_prompt_lookup_continues_the_latest_match_of_the_longest_suffix():
    tokens = [5, 6, 7, 1, 2, 9, 5, 6, 7, 3, 5, 6, 7]
    assert find_continuation(tokens, min_ngram=1, max_ngram=3, max_tokens=2) == (3, 5)
    assert find_continuation([1, 2, 3], min_ngram=1, max_ngram=3, max_tokens=4) == ()
    assert find_continuation([4, 8, 4], min_ngram=1, max_ngram=3, max_tokens=4) == (8, 4)


# Inside the engine


@pytest.fixture(scope="module")
def model(tiny_safetensors) -> LanguageModel:
    return load_model(tiny_safetensors).model


@pytest.fixture(scope="module")
def shallow_draft(tiny_safetensors) -> LanguageModel:
    """The tiny model cut to its first layer: a valid draft that is often wrong."""
    draft = load_model(tiny_safetensors).model
    draft.module.model.layers = draft.module.model.layers[:1]
    return draft


def speculative_config(method=SpeculativeMethod.DRAFT_MODEL, **kwargs) -> EngineConfig:
    spec = SpeculativeConfig(method=method, num_draft_tokens=4, draft_p_min=0.0, **kwargs)
    return make_config(speculative=spec)


def plain_tokens(model, prompt, sampling=GREEDY, generation=LONG_GENERATION) -> list[int]:
    return token_ids(generate_alone(model, prompt, sampling=sampling, generation=generation))


def long_requests(sampling: SamplingParams = GREEDY) -> list[EngineRequest]:
    return [
        make_request(p, index=i, sampling=sampling, generation=LONG_GENERATION)
        for i, p in enumerate(make_prompts())
    ]


def acceptance(outputs: Sequence[Sequence[EngineOutput]]) -> float:
    drafted = sum(o[-1].stats.draft_tokens for o in outputs)
    accepted = sum(o[-1].stats.accepted_draft_tokens for o in outputs)
    assert drafted > 0
    return accepted / drafted


@pytest.mark.parametrize("draft_kind", ["self", "shallow", "prompt_lookup"])
def test_greedy_output_is_the_same_with_every_drafter(model, shallow_draft, draft_kind):
    draft = {"self": model, "shallow": shallow_draft, "prompt_lookup": None}[draft_kind]
    method = SpeculativeMethod.PROMPT_LOOKUP if draft is None else SpeculativeMethod.DRAFT_MODEL
    expected = [plain_tokens(model, r.prompt_ids) for r in long_requests()]
    with running_engine(model, speculative_config(method), draft) as engine:
        outputs = generate_all(engine, long_requests())
        stats = engine.stats
    assert [token_ids(o) for o in outputs] == expected
    assert all(len(ids) == 24 for ids in expected)  # the token budget holds with drafts
    assert stats.num_kv_blocks_used == 0
    if draft_kind == "self":
        assert acceptance(outputs) >= 0.9
    if draft_kind == "shallow":
        assert acceptance(outputs) < 0.9


def test_drafts_verify_several_tokens_per_forward_pass(model):
    with running_engine(model, speculative_config(), model) as engine:
        (outputs,) = generate_all(engine, long_requests()[:1])
    stats = outputs[-1].stats
    # 24 tokens: the first from prefill; the others arrive up to 5 per verify step.
    assert stats.draft_tokens >= 16 and stats.accepted_draft_tokens >= 16


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.0, frequency_penalty=2.0),
        SamplingParams(temperature=0.0, repeat_penalty=1.5, presence_penalty=1.0),
    ],
    ids=["frequency", "repeat+presence"],
)
def test_penalties_apply_to_verification_as_to_decoding(model, shallow_draft, sampling):
    requests = long_requests(sampling)
    expected = [plain_tokens(model, r.prompt_ids, sampling) for r in requests]
    unpenalised = [plain_tokens(model, r.prompt_ids) for r in requests]
    assert expected != unpenalised
    for draft in (model, shallow_draft):
        with running_engine(model, speculative_config(), draft) as engine:
            outputs = generate_all(engine, requests)
        assert [token_ids(o) for o in outputs] == expected


def test_a_logit_bias_ban_holds_with_drafts(model):
    prompt = make_prompts()[1]
    banned = plain_tokens(model, prompt)[0]
    sampling = SamplingParams(temperature=0.0, logit_bias={banned: -float("inf")})
    expected = plain_tokens(model, prompt, sampling)
    assert banned not in expected and expected != plain_tokens(model, prompt)
    with running_engine(model, speculative_config(), model) as engine:
        (outputs,) = generate_all(engine, [make_request(prompt, sampling=sampling,
                                                   generation=LONG_GENERATION)])  # fmt: skip
    assert token_ids(outputs) == expected


@pytest.mark.parametrize("rule", list(AcceptanceRule))
def test_seeded_sampling_with_drafts_is_reproducible(model, shallow_draft, rule):
    sampling = SamplingParams(temperature=0.9, seed=42)
    runs = []
    for _ in range(2):
        config = speculative_config(acceptance=rule)
        with running_engine(model, config, shallow_draft) as engine:
            runs.append([token_ids(o) for o in generate_all(engine, long_requests(sampling))])
    assert runs[0] == runs[1]
    assert len({tuple(ids) for ids in runs[0]}) > 1


def test_preemption_keeps_greedy_outputs_with_drafts(model):
    expected = [plain_tokens(model, r.prompt_ids) for r in long_requests()]
    spec = SpeculativeConfig(num_draft_tokens=4, draft_p_min=0.0)
    with running_engine(model, make_config(num_kv_blocks=14, speculative=spec), model) as engine:
        outputs = generate_all(engine, long_requests())
        assert engine.stats.num_preemptions > 0
    assert [token_ids(o) for o in outputs] == expected


def test_prefix_hits_keep_greedy_outputs_and_draft_kv(model):
    request = make_request(make_prompts()[2], generation=LONG_GENERATION)
    with running_engine(model, speculative_config(), model) as engine:
        (first,) = generate_all(engine, [request])
        (second,) = generate_all(engine, [request])
    assert second[-1].stats.cached_tokens > 0
    assert token_ids(second) == token_ids(first) == plain_tokens(model, request.prompt_ids)
    # The draft model's KV of the cached blocks came with them: it still drafts right.
    assert acceptance([second]) >= 0.9


class EvenTokens:
    """Allows even token ids only; undoable, as a grammar matcher is."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def allowed_mask(self, vocab_size: int) -> mx.array:
        return mx.arange(vocab_size) % 2 == 0

    def advance(self, token_id: int) -> None:
        if token_id % 2:
            raise ValueError(f"token {token_id} is odd")
        self.seen.append(token_id)

    def rollback(self, num_tokens: int) -> None:
        del self.seen[len(self.seen) - num_tokens :]


def test_constraints_mask_every_verified_position(model):
    prompt = make_prompts()[3]
    with running_engine(model, make_config(), None) as engine:
        (plain,) = generate_all(engine, [_constrained(prompt, EvenTokens())])
    constraint = EvenTokens()
    with running_engine(model, speculative_config(), model) as engine:
        (drafted,) = generate_all(engine, [_constrained(prompt, constraint)])
    assert token_ids(drafted) == token_ids(plain)
    assert all(t % 2 == 0 for t in token_ids(drafted))
    assert constraint.seen == token_ids(drafted)
    assert drafted[-1].stats.accepted_draft_tokens > 0


def _constrained(prompt, constraint) -> EngineRequest:
    request = make_request(prompt, generation=LONG_GENERATION)
    return EngineRequest(
        prompt_ids=request.prompt_ids,
        sampling=request.sampling,
        generation=request.generation,
        detokenizer=request.detokenizer,
        constraint=constraint,
    )


def test_a_draft_model_is_required_exactly_when_configured(model):
    with pytest.raises(ValueError, match="draft_model"):
        Engine(model, speculative_config(), draft_model=None)
    with pytest.raises(ValueError, match="draft_model"):
        Engine(model, make_config(), draft_model=model)


class NarrowerVocabulary:
    """A model whose logits are one token narrower than the wrapped model's."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model

    def make_cache(self):
        return self.model.make_cache()

    def __call__(self, tokens, cache, *, last_only=False):
        return self.model(tokens, cache, last_only=last_only)[..., :-1]


def test_a_draft_model_with_another_vocabulary_is_refused(model):
    with pytest.raises(ValueError, match="vocabulary"):
        Engine(model, speculative_config(), draft_model=NarrowerVocabulary(model))


def test_drafts_compose_with_a_quantized_kv_cache(model):
    """Verification reads the target's KV through the same codec as plain decoding does, so
    greedy text with drafts equals greedy text without them on a turbo4 cache. (Without a
    residual window: plain decoding reads its recent positions from float16 exact copies,
    a verification its own new ones as computed, in float32.)"""
    quantized = {"cache_type_k": "turbo4", "cache_type_v": "turbo4", "cache_residual": 0}
    with running_engine(model, make_config(**quantized), None) as engine:
        plain = [token_ids(o) for o in generate_all(engine, long_requests())]
    spec = SpeculativeConfig(num_draft_tokens=4, draft_p_min=0.0)
    with running_engine(model, make_config(speculative=spec, **quantized), model) as engine:
        drafted = generate_all(engine, long_requests())
    assert [token_ids(o) for o in drafted] == plain
    assert plain != [plain_tokens(model, r.prompt_ids) for r in long_requests()]
    assert acceptance(drafted) > 0.5
