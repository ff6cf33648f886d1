from collections.abc import Sequence

import mlx.core as mx
import pytest

from mlxcel_core.cache import DenseKVCache, KVCache
from mlxcel_core.generate import generate_tokens, stream_generate
from mlxcel_core.request import ContextOverflowError, FinishReason, GenerationConfig

VOCAB = 32


class CountingModel:
    """Predicts `last input token + 1` at every position, with a real KV cache."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def make_cache(self) -> list[KVCache]:
        return [DenseKVCache(step=8)]

    def __call__(self, tokens: mx.array, cache: Sequence[KVCache], *, last_only=False):
        B, L = tokens.shape
        self.calls.append(L)
        cache[0].update_and_fetch(mx.zeros((B, 1, L, 1)), mx.zeros((B, 1, L, 1)))
        logits = 10.0 * mx.eye(VOCAB)[(tokens + 1) % VOCAB]
        return logits[:, -1:] if last_only else logits


class LetterDetokenizer:
    def __init__(self, texts: dict[int, str] | None = None) -> None:
        self.texts = texts or {}

    def add_token(self, token_id: int) -> str:
        return self.texts.get(token_id, chr(ord("a") + token_id))

    def finalize(self) -> str:
        return ""


def greedy(logits: mx.array, history: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


def _generate(prompt, config, texts=None):
    chunks = list(
        stream_generate(CountingModel(), prompt, greedy, LetterDetokenizer(texts), config)
    )
    return "".join(chunk.text for chunk in chunks), chunks[-1]


def test_prefill_runs_in_chunks_of_the_step_size():
    model = CountingModel()
    tokens = generate_tokens(model, list(range(10)), greedy, prefill_step_size=4)
    assert [next(tokens) for _ in range(3)] == [10, 11, 12]
    assert model.calls[:3] == [4, 4, 2]
    assert set(model.calls[3:]) == {1}


def test_stop_token_ends_with_stop_and_is_not_shown():
    text, last = _generate([1], GenerationConfig(context_size=64, stop_token_ids=frozenset({5})))
    assert text == "cde"
    assert last.finish_reason is FinishReason.STOP
    assert last.stats.generated_tokens == 4
    assert last.stats.prompt_tokens == 1


def test_max_tokens_ends_with_length():
    text, last = _generate([0], GenerationConfig(context_size=64, max_tokens=3))
    assert text == "bcd"
    assert last.finish_reason is FinishReason.LENGTH


def test_full_context_ends_with_length():
    text, last = _generate([0, 1, 2], GenerationConfig(context_size=6))
    assert text == "def"
    assert last.finish_reason is FinishReason.LENGTH


def test_stop_string_across_tokens_is_cut_with_what_follows():
    texts = {2: "Hello ", 3: "wo", 4: "rld", 5: "!"}
    config = GenerationConfig(context_size=64, stop_strings=("world",))
    text, last = _generate([1], config, texts)
    assert text == "Hello "
    assert last.finish_reason is FinishReason.STOP


def test_prompt_that_fills_the_context_is_refused():
    with pytest.raises(ContextOverflowError, match="4 tokens but the context size is 4"):
        _generate([1, 2, 3, 4], GenerationConfig(context_size=4))


@pytest.mark.parametrize(
    ("field", "value"),
    [("context_size", 0), ("max_tokens", -2), ("prefill_step_size", 0)],
)
def test_generation_config_rejects_out_of_range_values(field, value):
    options = {"context_size": 8, field: value}
    with pytest.raises(ValueError, match=field):
        GenerationConfig(**options)


class EvenThenStop:
    """Allows even tokens only, then, after `length` tokens, only the stop token 1."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.seen: list[int] = []

    def allowed_mask(self, vocab_size: int) -> mx.array:
        ids = mx.arange(vocab_size)
        return ids == 1 if len(self.seen) >= self.length else ids % 2 == 0

    def advance(self, token_id: int) -> None:
        self.seen.append(token_id)


def test_constraint_masks_every_draw_and_ends_with_a_stop_token():
    constraint = EvenThenStop(length=3)
    config = GenerationConfig(context_size=64, stop_token_ids=frozenset({1}))
    chunks = list(
        stream_generate(
            CountingModel(), [3], greedy, LetterDetokenizer(), config, constraint=constraint
        )
    )
    assert "".join(chunk.text for chunk in chunks) == "eaa"
    assert chunks[-1].finish_reason is FinishReason.STOP
    # Nothing is drawn past the stop token.
    assert constraint.seen == [4, 0, 0, 1]
