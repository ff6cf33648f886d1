"""`min_tokens`, `ignore_eos`, `max_predict_seconds` and a request that skips the prefix cache,
on the counting model (it predicts `last token + 1`; every other logit ties at 0, so a banned
prediction falls to token 0)."""

import mlx.core as mx
import pytest
from test_batching_engine import GENERATION, make_config, make_prompts, running_engine
from test_engine import CountingModel, LetterDetokenizer, drain
from test_generate import CountingModel as CachedCountingModel
from test_generate import EvenThenStop, greedy
from test_generate import LetterDetokenizer as TextDetokenizer

from mlxcel_core.engine import Engine, EngineConfig, EngineRequest, OutputQueue
from mlxcel_core.generate import stream_generate
from mlxcel_core.request import FinishReason, GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.stopping import StopMatch, StopStringMatcher, StopTokenBan, ban_tokens
from mlxcel_core.text_assembler import TextAssembler
from mlxcel_models.loading.loader import load_model

GREEDY = SamplingParams(temperature=0.0)
STOP = frozenset({3})


def config(**fields) -> GenerationConfig:
    return GenerationConfig(context_size=64, stop_token_ids=STOP, **fields)


def engine_tokens(
    generation: GenerationConfig, async_scheduling: bool, constraint=None
) -> tuple[list[int], object]:
    engine = Engine(CountingModel(), EngineConfig(async_scheduling=async_scheduling))
    try:
        sink = OutputQueue()
        request = EngineRequest(
            prompt_ids=(0,),
            sampling=GREEDY,
            generation=generation,
            detokenizer=LetterDetokenizer(),
            constraint=constraint,
        )
        engine.submit([request], sink)
        outputs = drain(sink, 1)
    finally:
        engine.shutdown(timeout=10.0)
    tokens = [o.token_id for o in outputs if o.token_id is not None]
    return tokens, outputs[-1]


def test_stop_tokens_are_banned_until_min_tokens(async_scheduling):
    # Unbanned: 1, 2, then the stop token 3. Banned for the first 5 draws, 3 falls to 0.
    assert engine_tokens(config(), async_scheduling)[0] == [1, 2]
    tokens, final = engine_tokens(config(min_tokens=5), async_scheduling)
    assert tokens == [1, 2, 0, 1, 2]
    assert final.finish_reason is FinishReason.STOP and final.stats.generated_tokens == 6


def test_ignore_eos_runs_to_the_token_limit(async_scheduling):
    tokens, final = engine_tokens(config(max_tokens=9, ignore_eos=True), async_scheduling)
    assert len(tokens) == 9 and 3 not in tokens
    assert final.finish_reason is FinishReason.LENGTH


def test_the_single_sequence_loop_bans_the_same_way():
    chunks = list(
        stream_generate(
            CachedCountingModel(), [0], greedy, LetterDetokenizer(), config(min_tokens=5)
        )
    )
    assert [c.token_id for c in chunks if c.token_id is not None] == [1, 2, 0, 1, 2]
    assert chunks[-1].finish_reason is FinishReason.STOP


class RollbackEvenThenStop(EvenThenStop):
    def rollback(self, num_tokens: int) -> None:
        del self.seen[len(self.seen) - num_tokens :]


def test_a_grammar_that_allows_only_the_stop_token_still_ends(async_scheduling):
    # Even tokens only, then only the stop token: the ban gives way rather than leave nothing.
    stop_one = GenerationConfig(context_size=64, stop_token_ids=frozenset({1}), min_tokens=10)
    tokens, final = engine_tokens(stop_one, async_scheduling, RollbackEvenThenStop(length=2))
    assert tokens == [0, 0] and final.finish_reason is FinishReason.STOP


def test_stop_strings_do_not_stop_before_min_tokens():
    text = TextAssembler(LetterDetokenizer(), config(stop_strings=("c",), min_tokens=4), 1)
    pieces = [text.add(token) for token in (1, 2, 0, 1, 2)]
    assert "".join(pieces) == "bcab" and text.finish_reason is FinishReason.STOP


def test_matcher_releases_whole_stop_strings_while_it_may_not_stop():
    matcher = StopStringMatcher(["stop"])
    assert matcher.feed("a stop st", may_stop=False).text == "a stop "
    assert matcher.feed("op!") == StopMatch("", True)


def test_time_limit_ends_after_a_newline_once_past():
    now = [0.0]
    text = TextAssembler(
        TextDetokenizer({2: "\n"}), config(max_predict_seconds=1.0), 1, clock=lambda: now[0]
    )
    text.add(0)
    now[0] = 5.0
    text.add(1)
    assert text.finish_reason is None  # no newline yet
    text.add(2)
    assert text.finish_reason is FinishReason.LENGTH


def test_ban_helpers():
    logits = mx.zeros((2, 4))
    banned = ban_tokens(logits, [frozenset({1}), frozenset({2, 9})])
    assert banned.tolist() == [[0, -mx.inf, 0, 0], [0, 0, -mx.inf, 0]]
    assert ban_tokens(logits, [frozenset(), frozenset()]) is logits
    ban = StopTokenBan(frozenset({3}), min_tokens=2)
    assert [ban.banned(n) for n in range(3)] == [{3}, {3}, set()]
    with pytest.raises(ValueError, match="min_tokens"):
        GenerationConfig(context_size=8, min_tokens=-1)
    with pytest.raises(ValueError, match="max_predict_seconds"):
        GenerationConfig(context_size=8, max_predict_seconds=0)


@pytest.fixture(scope="module")
def model(tiny_safetensors):
    return load_model(tiny_safetensors).model


def test_a_request_that_skips_the_prefix_cache_computes_its_whole_prompt(model, async_scheduling):
    prompt = make_prompts()[2]

    def request(use_prefix_cache: bool) -> EngineRequest:
        return EngineRequest(
            prompt_ids=prompt,
            sampling=GREEDY,
            generation=GENERATION,
            detokenizer=LetterDetokenizer(),
            use_prefix_cache=use_prefix_cache,
        )

    with running_engine(model, make_config(async_scheduling=async_scheduling)) as engine:
        runs = []
        for use in (True, False, True):
            sink = OutputQueue()
            engine.submit([request(use)], sink)
            runs.append(drain(sink, 1))
    assert [run[-1].error for run in runs] == [None] * 3
    cached = [run[-1].stats.cached_tokens for run in runs]
    assert cached == [0, 0, 12]
    tokens = [[o.token_id for o in run if o.token_id is not None] for run in runs]
    assert tokens[0] == tokens[1] == tokens[2]
