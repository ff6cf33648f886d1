"""The sampler's stages, one by one, against hand-computed distributions on small
vocabularies: truncation (top-k, top-p, min-p, typical-p, top-n-sigma, XTC), temperature,
logit bias, repetition penalties and DRY."""

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.sampling import (
    apply_dry,
    apply_logit_bias,
    apply_min_p,
    apply_penalties,
    apply_temperature,
    apply_top_k,
    apply_top_n_sigma,
    apply_top_p,
    apply_typical_p,
    apply_xtc,
)

from sampling_logits import LOGITS, PROBS, kept

INF = math.inf


def softmax(logits: mx.array) -> np.ndarray:
    return np.array(mx.softmax(logits, axis=-1))


# --- truncation stages ------------------------------------------------------------------


def test_top_k_keeps_the_k_highest_logits():
    assert kept(apply_top_k(LOGITS, 2)) == {0, 2}
    assert kept(apply_top_k(LOGITS, 1)) == {0}


def test_top_k_zero_or_full_vocabulary_is_disabled():
    assert apply_top_k(LOGITS, 0) is LOGITS
    assert apply_top_k(LOGITS, 5) is LOGITS


def test_top_k_works_per_row():
    batch = mx.stack([LOGITS, -LOGITS])
    result = apply_top_k(batch, 2)
    assert kept(result[0]) == {0, 2}
    assert kept(result[1]) == {3, 1}


def test_top_p_keeps_the_token_that_crosses_p_and_renormalises():
    # Sorted: 0.5, 0.2, 0.15 | 0.1, 0.05; mass before 0.15 is 0.7 < 0.75, before 0.1 is 0.85.
    result = apply_top_p(LOGITS, 0.75)
    assert kept(result) == {0, 2, 4}
    np.testing.assert_allclose(
        softmax(result), [0.5 / 0.85, 0, 0.2 / 0.85, 0, 0.15 / 0.85], atol=1e-6
    )


def test_top_p_edges():
    assert kept(apply_top_p(LOGITS, 0.0)) == {0}
    assert kept(apply_top_p(LOGITS, 0.49)) == {0}
    assert kept(apply_top_p(LOGITS, 0.51)) == {0, 2}
    assert apply_top_p(LOGITS, 1.0) is LOGITS


def test_top_p_stops_at_the_token_that_reaches_p_exactly():
    # Uniform over 4: cumulative 0.25, 0.5, ... reaches 0.5 at the second token.
    assert len(kept(apply_top_p(mx.zeros((4,)), 0.5))) == 2


def test_min_p_keeps_tokens_above_a_fraction_of_the_top_probability():
    # 0.25 * 0.5 = 0.125: 0.5, 0.2 and 0.15 survive.
    assert kept(apply_min_p(LOGITS, 0.25)) == {0, 2, 4}
    assert kept(apply_min_p(LOGITS, 0.41)) == {0}
    assert kept(apply_min_p(LOGITS, 1.0)) == {0}
    assert apply_min_p(LOGITS, 0.0) is LOGITS


def test_typical_p_ranks_by_distance_from_the_entropy():
    # H = 1.3331 nats; |-log p - H| = 0.640 (0.5), 0.276 (0.2), 0.564 (0.15), 0.969 (0.1),
    # 1.663 (0.05). In that order the masses before each token are 0, 0.2, 0.35, 0.85, 0.95.
    assert kept(apply_typical_p(LOGITS, 0.3)) == {2, 4}
    assert kept(apply_typical_p(LOGITS, 0.5)) == {0, 2, 4}
    assert kept(apply_typical_p(LOGITS, 0.9)) == {0, 1, 2, 4}
    assert kept(apply_typical_p(LOGITS, 0.0)) == {2}
    assert apply_typical_p(LOGITS, 1.0) is LOGITS


def test_typical_p_keeps_tokens_until_the_mass_exceeds_p():
    # Uniform over 4: every token is equally typical; 0.5 is reached but not exceeded at two.
    assert len(kept(apply_typical_p(mx.zeros((4,)), 0.5))) == 3


def test_typical_p_ignores_removed_tokens():
    with_removed = mx.concatenate([LOGITS, mx.array([-INF, -INF])])
    assert kept(apply_typical_p(with_removed, 0.3)) == {2, 4}
    assert kept(apply_typical_p(with_removed, 0.9)) == {0, 1, 2, 4}


def test_top_n_sigma_uses_the_spread_of_the_surviving_logits():
    # Finite logits 3, 2, 1, 0, -1: mean 1, population std sqrt(2) = 1.414.
    logits = mx.array([3.0, 2.0, 1.0, 0.0, -1.0, -INF])
    assert kept(apply_top_n_sigma(logits, 1.0)) == {0, 1}
    assert kept(apply_top_n_sigma(logits, 2.0)) == {0, 1, 2}
    assert kept(apply_top_n_sigma(logits, 10.0)) == {0, 1, 2, 3, 4}
    assert apply_top_n_sigma(logits, -1.0) is logits
    assert apply_top_n_sigma(logits, 0.0) is logits


XTC_LOGITS = mx.array(np.log([0.1, 0.4, 0.2, 0.3]).astype(np.float32))


def test_xtc_removes_all_top_choices_but_the_least_likely():
    # Above 0.15: 0.4, 0.3, 0.2; all but 0.2 go.
    result = apply_xtc(XTC_LOGITS, 1.0, 0.15, 0.0)
    assert kept(result) == {0, 2}
    np.testing.assert_allclose(softmax(result), [1 / 3, 0, 2 / 3, 0], atol=1e-6)


def test_xtc_acts_only_when_the_draw_is_below_the_probability():
    assert kept(apply_xtc(XTC_LOGITS, 0.6, 0.15, mx.array(0.5))) == {0, 2}
    assert kept(apply_xtc(XTC_LOGITS, 0.4, 0.15, mx.array(0.5))) == {0, 1, 2, 3}
    assert kept(apply_xtc(XTC_LOGITS, 0.5, 0.15, mx.array(0.5))) == {0, 1, 2, 3}
    assert kept(apply_xtc(XTC_LOGITS, 1.0, 0.15, 0.999)) == {0, 2}


def test_xtc_edges_leave_the_logits_alone():
    assert apply_xtc(XTC_LOGITS, 0.0, 0.15, 0.0) is XTC_LOGITS
    assert apply_xtc(XTC_LOGITS, 1.0, 0.51, 0.0) is XTC_LOGITS
    # Only 0.4 reaches 0.35: a single top choice is never removed.
    assert kept(apply_xtc(XTC_LOGITS, 1.0, 0.35, 0.0)) == {0, 1, 2, 3}


def test_temperature_scales_and_zero_keeps_the_first_argmax():
    np.testing.assert_allclose(np.array(apply_temperature(LOGITS, 0.5)), np.log(PROBS) / 0.5)
    assert kept(apply_temperature(mx.array([1.0, 3.0, 3.0, 2.0]), 0.0)) == {1}
    assert kept(apply_temperature(LOGITS, -1.0)) == {0}


# --- logit bias and penalties --------------------------------------------------------------


def test_logit_bias_adds_and_bans():
    result = np.array(apply_logit_bias(LOGITS, {0: -INF, 3: 1.5}))
    expected = np.log(PROBS)
    expected[0] = -INF
    expected[3] += 1.5
    np.testing.assert_allclose(result, expected)
    assert apply_logit_bias(LOGITS, {}) is LOGITS


def test_logit_bias_rejects_token_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match=r"logit_bias token id must be in \[0, 5\), got 5"):
        apply_logit_bias(LOGITS, {5: 1.0})


PENALTY_LOGITS = mx.array([2.0, -1.0, 0.5, 1.0, 0.0])


def penalise(history: list[int], **overrides: float) -> np.ndarray:
    settings = {
        "repeat_penalty": 2.0,
        "repeat_last_n": -1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
    } | overrides
    return np.array(apply_penalties(PENALTY_LOGITS, mx.array(history, dtype=mx.int32), **settings))


def test_penalties_over_the_whole_history():
    # Counts: token 0 twice, 1 once, 3 once. Positive logits are divided, others multiplied.
    np.testing.assert_allclose(
        penalise([0, 1, 0, 3]),
        [2 / 2 - 2 * 0.25 - 0.5, -1 * 2 - 0.25 - 0.5, 0.5, 1 / 2 - 0.25 - 0.5, 0.0],
    )


def test_penalties_look_only_at_the_last_repeat_last_n_tokens():
    np.testing.assert_allclose(
        penalise([0, 1, 0, 3], repeat_last_n=2),
        [2 / 2 - 0.25 - 0.5, -1.0, 0.5, 1 / 2 - 0.25 - 0.5, 0.0],
    )
    np.testing.assert_allclose(penalise([0, 1, 0, 3], repeat_last_n=64), penalise([0, 1, 0, 3]))
    np.testing.assert_allclose(penalise([0, 1, 0, 3], repeat_last_n=10**20), penalise([0, 1, 0, 3]))


def test_penalties_disabled():
    assert (
        apply_penalties(
            PENALTY_LOGITS,
            mx.array([0, 1], dtype=mx.int32),
            repeat_penalty=2.0,
            repeat_last_n=0,
            presence_penalty=1.0,
            frequency_penalty=1.0,
        )
        is PENALTY_LOGITS
    )
    np.testing.assert_allclose(penalise([]), np.array(PENALTY_LOGITS))
    np.testing.assert_allclose(
        penalise([0, 1], repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0),
        np.array(PENALTY_LOGITS),
    )


# --- DRY -------------------------------------------------------------------------------------

DRY_VOCAB = 10


def dry_penalties(history: list[int], breakers: frozenset[int] = frozenset(), **overrides):
    settings = {"multiplier": 0.8, "base": 1.75, "allowed_length": 2, "penalty_last_n": -1}
    result = apply_dry(
        mx.zeros((DRY_VOCAB,)),
        np.array(history),
        breaker_ids=breakers,
        **(settings | overrides),
    )
    return -np.array(result)


def naive_dry(history, breakers, multiplier, base, allowed_length):
    """Brute force: for each earlier position, how long a suffix of the history ends there."""
    size = len(history)
    limit = size
    for distance, token in enumerate(reversed(history)):
        if token in breakers:
            limit = distance
            break
    expected = np.zeros(DRY_VOCAB)
    if size <= allowed_length or limit < allowed_length:
        return expected
    for end in range(size - 1):
        length = 0
        while length <= end and history[end - length] == history[size - 1 - length]:
            length += 1
        length = min(length, limit)
        following = history[end + 1]
        if length >= allowed_length and following not in breakers:
            penalty = multiplier * base ** (length - allowed_length)
            expected[following] = max(expected[following], penalty)
    return expected


def test_dry_penalises_the_token_that_extends_a_repeat():
    # llama.cpp's example "a b c c b c y a b c": c would make a repeat of 3 + 1, y of 2 + 1.
    a, b, c, y = 0, 1, 2, 3
    penalties = dry_penalties([a, b, c, c, b, c, y, a, b, c])
    expected = np.zeros(DRY_VOCAB)
    expected[c] = 0.8 * 1.75
    expected[y] = 0.8
    np.testing.assert_allclose(penalties, expected, rtol=1e-6)


def test_dry_breaker_stops_the_match():
    history = [1, 5, 2, 3, 4, 1, 5, 2]
    assert dry_penalties(history)[3] == pytest.approx(0.8 * 1.75)
    np.testing.assert_array_equal(dry_penalties(history, frozenset({5})), 0.0)


def test_dry_never_penalises_a_breaker():
    history = [0, 1, 5, 0, 1]
    assert dry_penalties(history)[5] == pytest.approx(0.8)
    np.testing.assert_array_equal(dry_penalties(history, frozenset({5})), 0.0)


def test_dry_window_and_switches():
    history = [0, 1, 2, 9, 9, 9, 0, 1]
    assert dry_penalties(history)[2] == pytest.approx(0.8)
    np.testing.assert_array_equal(dry_penalties(history, penalty_last_n=4), 0.0)
    np.testing.assert_array_equal(dry_penalties(history, penalty_last_n=0), 0.0)
    np.testing.assert_array_equal(dry_penalties(history, multiplier=0.0), 0.0)
    np.testing.assert_array_equal(dry_penalties(history, base=0.9), 0.0)


def test_dry_clamps_the_exponent_to_stay_finite():
    # A 50-token repeat at base 10 would need 10**48; the exponent stops at 88.72 / ln 10 = 38.
    history = list(range(DRY_VOCAB)) * 6
    penalties = dry_penalties(history, base=10.0)
    assert penalties[0] == pytest.approx(0.8 * 10.0**38, rel=1e-5)


def test_dry_matches_a_brute_force_reference():
    rng = np.random.default_rng(0)
    for _ in range(200):
        history = rng.integers(0, 4, size=int(rng.integers(1, 40))).tolist()
        breakers = frozenset({3}) if rng.random() < 0.5 else frozenset()
        expected = naive_dry(history, breakers, 0.8, 1.75, 2)
        np.testing.assert_allclose(dry_penalties(history, breakers), expected, rtol=1e-5)
