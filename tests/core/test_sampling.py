"""The sampler chain against hand-computed distributions on small vocabularies: what it
draws, in which stage order, with which seed, and the validation of its parameters."""

import dataclasses
import math

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.sampling import (
    DEFAULT_SAMPLERS,
    Sampler,
    SamplerStage,
    SamplingParams,
    parse_sampler_order,
)

from sampling_logits import LOGITS, PROBS, kept

INF = math.inf

# Every stage off: the draw is from softmax(logits) at temperature 1.
PLAIN = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)


def no_history() -> mx.array:
    return mx.array([], dtype=mx.int32)


# --- the sampler ---------------------------------------------------------------------------


def draw(sampler: Sampler, count: int, logits: mx.array = LOGITS) -> list[int]:
    return [sampler(logits, no_history()).item() for _ in range(count)]


def test_sampler_returns_a_scalar_int32():
    token = Sampler(PLAIN)(LOGITS[None], no_history())
    assert token.shape == ()
    assert token.dtype == mx.int32


def test_sampler_rejects_batched_logits():
    with pytest.raises(ValueError, match=r"logits must have shape \(V,\) or \(1, V\)"):
        Sampler(PLAIN)(mx.stack([LOGITS, LOGITS]), no_history())


def test_sampler_draws_from_the_softmax():
    tokens = draw(Sampler(PLAIN), 3000)
    frequencies = np.bincount(tokens, minlength=5) / len(tokens)
    np.testing.assert_allclose(frequencies, PROBS, atol=0.03)


def test_sampler_draws_from_the_truncated_tempered_distribution():
    params = dataclasses.replace(PLAIN, top_p=0.75, temperature=0.5)
    tokens = draw(Sampler(params), 3000)
    survivors = np.array([0.5, 0, 0.2, 0, 0.15]) ** 2
    frequencies = np.bincount(tokens, minlength=5) / len(tokens)
    np.testing.assert_allclose(frequencies, survivors / survivors.sum(), atol=0.03)


def test_seeded_samplers_are_reproducible_and_independent():
    first = draw(Sampler(dataclasses.replace(PLAIN, seed=7)), 100)
    interleaved_a = Sampler(dataclasses.replace(PLAIN, seed=7))
    interleaved_b = Sampler(dataclasses.replace(PLAIN, seed=8))
    second, other = [], []
    for _ in range(100):
        mx.random.seed(len(other))
        second.append(interleaved_a(LOGITS, no_history()).item())
        other.append(interleaved_b(LOGITS, no_history()).item())
    assert first == second
    assert first != other


def test_unseeded_samplers_pick_their_own_seed():
    sampler = Sampler(dataclasses.replace(PLAIN, seed=None))
    assert 0 <= sampler.seed < 2**32
    assert draw(Sampler(dataclasses.replace(PLAIN, seed=sampler.seed)), 50) == draw(sampler, 50)


def test_temperature_before_top_p_widens_the_nucleus():
    # At T=2 the probabilities are proportional to sqrt(p): 0.339, 0.2145, 0.1857, 0.1516,
    # 0.1072, so top-p 0.75 keeps four tokens instead of three.
    last = Sampler(dataclasses.replace(PLAIN, temperature=2.0, top_p=0.75))
    first = Sampler(
        dataclasses.replace(
            PLAIN,
            temperature=2.0,
            top_p=0.75,
            samplers=(SamplerStage.TEMPERATURE, SamplerStage.TOP_P),
        )
    )
    assert kept(last.apply_chain(LOGITS, no_history())) == {0, 2, 4}
    assert kept(first.apply_chain(LOGITS, no_history())) == {0, 1, 2, 4}
    assert 1 not in draw(last, 300)
    assert 1 in draw(first, 300)


def test_temperature_applies_where_the_order_puts_it():
    params = dataclasses.replace(PLAIN, temperature=0.5, samplers=(SamplerStage.TOP_K,))
    np.testing.assert_allclose(
        np.array(Sampler(params).apply_chain(LOGITS, no_history())), np.log(PROBS)
    )


def test_top_k_zero_disables_top_k_in_the_sampler():
    assert kept(Sampler(PLAIN).apply_chain(LOGITS, no_history())) == {0, 1, 2, 3, 4}
    top_2 = Sampler(dataclasses.replace(PLAIN, top_k=2))
    assert kept(top_2.apply_chain(LOGITS, no_history())) == {0, 2}
    assert set(draw(top_2, 200)) == {0, 2}


def test_xtc_in_the_sampler_never_draws_the_top_choice():
    params = dataclasses.replace(PLAIN, xtc_probability=1.0, xtc_threshold=0.12)
    # Above 0.12: 0.5, 0.2, 0.15; only 0.15 (token 4) stays among them.
    assert set(draw(Sampler(params), 300)) == {1, 3, 4}
    never = dataclasses.replace(PLAIN, xtc_probability=0.0, xtc_threshold=0.12)
    assert 0 in draw(Sampler(never), 100)


def test_greedy_is_the_argmax_after_penalties_and_bias():
    logits = mx.array([2.0, 1.5, 0.0, 1.0])
    greedy = dataclasses.replace(PLAIN, temperature=0.0)
    assert set(draw(Sampler(greedy), 20, logits)) == {0}
    penalised = Sampler(dataclasses.replace(greedy, repeat_penalty=2.0))
    assert penalised(logits, mx.array([2, 0], dtype=mx.int32)).item() == 1
    banned = Sampler(dataclasses.replace(greedy, logit_bias={0: -INF, 1: -INF}))
    assert banned(logits, no_history()).item() == 3
    without_stage = dataclasses.replace(greedy, samplers=(SamplerStage.TOP_K,))
    assert set(draw(Sampler(without_stage), 20, logits)) == {0}


def test_sampler_accepts_a_lazy_history_and_applies_dry():
    params = dataclasses.replace(PLAIN, temperature=0.0, dry_multiplier=10.0)
    logits = mx.array([0.0, 0.0, 1.0, 0.0])
    history = mx.array([0, 1, 2, 3, 0], dtype=mx.int32) + mx.array([0, 0, 0, 0, 1], dtype=mx.int32)
    # History 0 1 2 3 1: no repeat of length 2, so token 2 stays the argmax.
    assert Sampler(params)(logits, history).item() == 2
    repeated = mx.array([0, 1, 2, 3, 0, 1], dtype=mx.int32)
    assert Sampler(params)(logits, repeated).item() != 2


# --- parameters --------------------------------------------------------------------------


def test_parse_sampler_order_reads_letters_and_names():
    assert parse_sampler_order("edskypmxt") == DEFAULT_SAMPLERS
    names = "penalties;dry;top-n-sigma;top-k;typical;nucleus;min-p;xtc;temperature"
    assert parse_sampler_order(names) == DEFAULT_SAMPLERS
    assert parse_sampler_order("top_k;temp") == (SamplerStage.TOP_K, SamplerStage.TEMPERATURE)
    assert parse_sampler_order("typ_p;typical_p;typ;typ-p;typical-p") == (
        (SamplerStage.TYPICAL_P,) * 5
    )
    assert parse_sampler_order("temp") == (SamplerStage.TEMPERATURE,)
    assert parse_sampler_order("kt") == (SamplerStage.TOP_K, SamplerStage.TEMPERATURE)
    assert parse_sampler_order("top_p;") == (SamplerStage.TOP_P,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("top_k;beam", r"unknown sampler name 'beam'; valid names: penalties, dry"),
        ("infill;top_k", r"unknown sampler name 'infill'"),
        ("kqt", r"unknown sampler letter 'q'; valid letters: e=penalties"),
        ("ia", r"unknown sampler letter 'i'"),
    ],
)
def test_parse_sampler_order_rejects_unknown_stages(text, message):
    with pytest.raises(ValueError, match=message):
        parse_sampler_order(text)


def test_sampling_params_defaults_follow_llama_server():
    params = SamplingParams()
    assert (params.temperature, params.top_k, params.top_p, params.min_p) == (0.8, 40, 0.95, 0.05)
    assert params.samplers == tuple(parse_sampler_order("edskypmxt"))
    assert params.dry_sequence_breakers == ("\n", ":", '"', "*")
    assert params.seed is None


def test_sampling_params_accept_numpy_scalars():
    params = SamplingParams(top_p=np.float32(0.5), top_k=np.int64(3), seed=np.uint32(9))
    assert Sampler(params)(LOGITS, no_history()).item() == 0
    assert Sampler(params).seed == 9


def test_sampling_params_are_immutable_and_normalised():
    params = SamplingParams(logit_bias={3: 1.0}, samplers=["top_k", "temperature"])
    assert params.samplers == (SamplerStage.TOP_K, SamplerStage.TEMPERATURE)
    assert isinstance(params.samplers[0], SamplerStage)
    with pytest.raises(TypeError):
        params.logit_bias[3] = 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.top_k = 1
    assert hash(params) == hash(SamplingParams(logit_bias={3: 1.0}, samplers=params.samplers))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", math.nan, "temperature must be a finite number of magnitude <= 3.402823e"),
        # Finite in Python, infinite in the sampler's float32.
        ("temperature", 1e39, r"temperature must be a finite number .*, got 1e\+39"),
        ("top_k", -1, "top_k must be an integer >= 0, got -1"),
        ("top_k", True, "top_k must be an integer >= 0, got True"),
        ("top_p", 1.5, r"top_p must be a number in \[0.0, 1.0\], got 1.5"),
        ("min_p", -0.1, r"min_p must be a number in \[0.0, 1.0\], got -0.1"),
        ("typical_p", 2, r"typical_p must be a number in \[0.0, 1.0\], got 2"),
        ("top_n_sigma", INF, "top_n_sigma must be a finite number .*, got inf"),
        ("xtc_probability", 1.1, r"xtc_probability must be a number in \[0.0, 1.0\]"),
        ("xtc_threshold", -0.5, r"xtc_threshold must be a number in \[0.0, 1.0\]"),
        ("repeat_penalty", 0.0, "repeat_penalty must be a number > 0, got 0.0"),
        ("repeat_last_n", -2, "repeat_last_n must be an integer >= -1, got -2"),
        ("presence_penalty", "1", "presence_penalty must be a finite number .*, got '1'"),
        ("presence_penalty", -1e39, "presence_penalty must be a finite number"),
        ("frequency_penalty", -INF, "frequency_penalty must be a finite number"),
        ("dry_multiplier", -1.0, "dry_multiplier must be a number >= 0, got -1.0"),
        ("dry_base", -1.0, "dry_base must be a number >= 0, got -1.0"),
        ("dry_allowed_length", 1.5, "dry_allowed_length must be an integer >= 0, got 1.5"),
        ("dry_penalty_last_n", -3, "dry_penalty_last_n must be an integer >= -1, got -3"),
        (
            "dry_sequence_breakers",
            ("\n", ""),
            "dry_sequence_breakers must be a sequence of non-empty strings",
        ),
        ("dry_sequence_breakers", "\n", "dry_sequence_breakers must be a sequence of"),
        ("logit_bias", {-1: 1.0}, "logit_bias token id must be an integer >= 0, got -1"),
        (
            "logit_bias",
            {2: INF},
            r"logit_bias\[2\] must be -inf or a number of magnitude .*, got inf",
        ),
        ("logit_bias", {2: 1e39}, r"logit_bias\[2\] must be -inf or a number of magnitude"),
        ("samplers", ("top_k", "beam"), "samplers must be stage names from .*, got 'beam'"),
        ("samplers", "top_k", "samplers must be a sequence of stage names, got 'top_k'"),
        ("seed", -1, r"seed must be None or an integer in \[0, 18446744073709551616\), got -1"),
        ("seed", 2**64, r"seed must be None or an integer in \[0, .*\), got 18446744073709551616"),
    ],
)
def test_sampling_params_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})
