"""Log probabilities: the raw log-softmax, the chosen token and the sorted top list."""

import math

import mlx.core as mx
import pytest
from test_generate import CountingModel, LetterDetokenizer, greedy

from mlxcel_core.generate import stream_generate
from mlxcel_core.logprobs import TokenLogprobs, make_logprobs
from mlxcel_core.request import GenerationConfig


def test_make_logprobs_is_the_log_softmax_sorted_descending():
    logits = mx.array([1.0, 3.0, 2.0, 0.0])
    logprobs = make_logprobs(logits, mx.array(2), 3)
    mx.eval(*logprobs.arrays())
    entry = logprobs.read(2)
    expected = [v - math.log(sum(math.exp(x) for x in (1, 3, 2, 0))) for v in (1, 3, 2, 0)]
    assert entry.logprob == pytest.approx(expected[2], rel=1e-5)
    assert entry.top_ids == (1, 2, 0)
    assert entry.top_logprobs == pytest.approx([expected[1], expected[2], expected[0]], rel=1e-5)


def test_make_logprobs_clips_the_top_list_and_allows_zero():
    logits = mx.array([0.5, 0.25])
    wide = make_logprobs(logits, mx.array(0), 20)
    none = make_logprobs(logits, mx.array(0), 0)
    mx.eval(*wide.arrays(), *none.arrays())
    assert wide.read(0).top_ids == (0, 1)
    assert none.read(0).top_ids == () and none.read(0).logprob < 0


def test_make_logprobs_refuses_a_negative_count():
    with pytest.raises(ValueError, match="num_top"):
        make_logprobs(mx.array([0.0]), mx.array(0), -1)


def test_token_logprobs_checks_lengths():
    with pytest.raises(ValueError, match="top_ids"):
        TokenLogprobs(token_id=0, logprob=0.0, top_ids=(1,), top_logprobs=())


def test_stream_generate_reports_logprobs_only_when_asked():
    config = GenerationConfig(context_size=64, max_tokens=3)
    plain = list(stream_generate(CountingModel(), [0], greedy, LetterDetokenizer(), config))
    assert all(chunk.logprobs is None for chunk in plain)
    config = GenerationConfig(context_size=64, max_tokens=3, num_top_logprobs=2)
    chunks = list(stream_generate(CountingModel(), [0], greedy, LetterDetokenizer(), config))
    entries = [chunk.logprobs for chunk in chunks if chunk.token_id is not None]
    assert [e.token_id for e in entries] == [1, 2, 3]
    for entry in entries:
        assert entry.top_ids[0] == entry.token_id and len(entry.top_ids) == 2
        assert entry.logprob == entry.top_logprobs[0] >= entry.top_logprobs[1]
    assert chunks[-1].logprobs is None


def test_generation_config_refuses_negative_num_top_logprobs():
    with pytest.raises(ValueError, match="num_top_logprobs"):
        GenerationConfig(context_size=8, num_top_logprobs=-1)
