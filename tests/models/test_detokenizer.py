"""Incremental detokenization: pieces concatenate to the full decode, never half a character."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.tokenizer import IncrementalDetokenizer, Tokenizer

SENTENCEPIECE_METADATA = json.loads(
    (Path(__file__).parent / "data" / "sentencepiece_llama_cpp_ids.json").read_text()
)["metadata"]

TEXTS = [
    "Emoji 😀👍🏽 and a family 👨\u200d👩\u200d👧 🇫🇷!",
    "日本語のテキストと中文文本\uff0c한국어도.",
    "Accents: café naïve résumé Ærøskøbing e\u0301 ß",
    "Hello  world,\n\n   indented\tand trailing  ",
    "  starts with spaces",
]


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(read_gguf_header(smollm2_path, arrays=True).metadata)


@pytest.fixture(scope="module")
def sentencepiece() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(SENTENCEPIECE_METADATA)


def stream(tokenizer: Tokenizer, ids: Sequence[int], *, skip_special_tokens: bool = True):
    detokenizer = tokenizer.make_detokenizer(skip_special_tokens=skip_special_tokens)
    return [detokenizer.add_token(i) for i in ids] + [detokenizer.finalize()]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("vocabulary", ["smollm2", "sentencepiece"])
def test_pieces_concatenate_to_the_text(request, vocabulary: str, text: str):
    tokenizer: Tokenizer = request.getfixturevalue(vocabulary)
    ids = tokenizer.encode(text)
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_characters_split_across_tokens_are_held_back(smollm2: Tokenizer):
    ids = smollm2.encode("😀")
    assert len(ids) > 1
    pieces = stream(smollm2, ids)
    assert pieces[:-2] == [""] * (len(ids) - 1) and pieces[-2] == "😀"


def test_sentencepiece_spaces_survive_mid_stream(sentencepiece: Tokenizer):
    words = [sentencepiece.encode(word, add_special_tokens=False) for word in ("Hello", "world")]
    im_end = sentencepiece.encode("<|im_end|>", add_special_tokens=False)
    ids = [1, *words[0], *im_end, *im_end, *words[1], *words[0]]
    pieces = stream(sentencepiece, ids)
    assert "".join(pieces) == sentencepiece.decode(ids) == "Hello world Hello"
    rendered = stream(sentencepiece, ids, skip_special_tokens=False)
    assert "".join(rendered) == sentencepiece.decode(ids, skip_special_tokens=False)


def test_special_tokens_render_only_when_asked(smollm2: Tokenizer):
    ids = smollm2.encode("Paris.<|im_end|>")
    assert "".join(stream(smollm2, ids)) == "Paris."
    assert "".join(stream(smollm2, ids, skip_special_tokens=False)) == "Paris.<|im_end|>"


def _random_streams(candidates: Sequence[int], count: int = 20) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.choice(candidates) for _ in range(rng.randrange(1, 60))] for _ in range(count)]


BYTE_TOKEN = 6


@pytest.mark.parametrize("vocabulary", ["smollm2", "sentencepiece"])
def test_random_token_streams_match_full_decode(request, vocabulary: str):
    tokenizer: Tokenizer = request.getfixturevalue(vocabulary)
    # Arbitrary byte-level tokens (invalid UTF-8 included); for SentencePiece, all but the
    # byte-fallback tokens, whose invalid runs the full decode blanks as a whole.
    types = SENTENCEPIECE_METADATA["tokenizer.ggml.token_type"]
    candidates = [
        i for i in range(tokenizer.vocab_size) if vocabulary == "smollm2" or types[i] != BYTE_TOKEN
    ]
    for ids in _random_streams(candidates):
        for skip in (True, False):
            pieces = stream(tokenizer, ids, skip_special_tokens=skip)
            assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_finalize_flushes_an_incomplete_character_and_resets(smollm2: Tokenizer):
    first_byte_tokens = smollm2.encode("😀")[:1]
    detokenizer = smollm2.make_detokenizer()
    assert detokenizer.add_token(first_byte_tokens[0]) == ""
    assert detokenizer.finalize() == smollm2.decode(first_byte_tokens)
    assert detokenizer.add_token(smollm2.encode("Hi")[0]) == "Hi"


class RecordingDecoder:
    """Decodes each id as one letter and records how many ids every call decoded."""

    def __init__(self) -> None:
        self.window_sizes: list[int] = []

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        self.window_sizes.append(len(ids))
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_each_step_decodes_a_bounded_window():
    decoder = RecordingDecoder()
    detokenizer = IncrementalDetokenizer(decoder)
    pieces = [detokenizer.add_token(i) for i in range(2000)]
    assert "".join(pieces) == decoder.decode(range(2000))
    assert max(decoder.window_sizes[:-1]) <= 2
