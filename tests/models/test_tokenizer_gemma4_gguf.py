"""Gemma 4's GGUF vocabulary (`tokenizer.ggml.model` `gemma4`) tokenizes as llama.cpp's
`LLAMA_VOCAB_PRE_TYPE_GEMMA4` does: spaces become `▁` with none prepended, the text is cut
into runs of newlines and runs of the rest, each run is merged by rank over its UTF-8
characters, and characters without a token fall back to their `<0xXX>` bytes."""

from __future__ import annotations

import pytest

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.tokenizer import Tokenizer, build_gguf_tokenizer
from mlxcel_models.tokenizer.gguf_vocab import gguf_adds_bos

_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>"]
_BYTES = [f"<0x{value:02X}>" for value in range(256)]
_PIECES = ["▁", "h", "e", "l", "o", "\n", "he", "ll", "hell", "hello", "▁hello", "\n\n", "é"]
TOKENS = _SPECIAL + _BYTES + _PIECES
MERGES = ["h e", "l l", "he ll", "hell o", "▁ hello", "\n \n"]
# Control tokens, then bytes, then normal pieces (llama.cpp's token types 3, 6, 1).
TYPES = [3] * len(_SPECIAL) + [6] * len(_BYTES) + [1] * len(_PIECES)
METADATA = {
    "tokenizer.ggml.model": "gemma4",
    "tokenizer.ggml.tokens": TOKENS,
    "tokenizer.ggml.token_type": TYPES,
    "tokenizer.ggml.merges": MERGES,
    "tokenizer.ggml.bos_token_id": 2,
    "tokenizer.ggml.eos_token_id": 1,
    "tokenizer.ggml.add_bos_token": True,
    "tokenizer.ggml.add_space_prefix": False,
}


def token_id(text: str) -> int:
    return TOKENS.index(text)


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("hello hello", ["hello", "▁hello"]),
        (" hello", ["▁hello"]),
        ("hello\n\nhello", ["hello", "\n\n", "hello"]),
        ("hell\n\n\nhe", ["hell", "\n\n", "\n", "he"]),
        # "i" has no token: its byte; "é" has one.
        ("hi é", ["h", "<0x69>", "▁", "é"]),
        ("<|turn>hello", ["<|turn>", "hello"]),
    ],
)
def test_gemma4_vocabulary_tokenizes_as_llama_cpp(text, pieces):
    tokenizer = build_gguf_tokenizer(METADATA)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert ids == [token_id(piece) for piece in pieces]


def test_gemma4_vocabulary_decodes_back_to_the_text():
    tokenizer = Tokenizer.from_gguf_metadata(METADATA)
    text = "hello hi\n\né hell"
    ids = tokenizer.encode(text)
    assert ids[0] == 2
    assert tokenizer.decode(ids[1:]) == text
    assert gguf_adds_bos(METADATA)


def test_gemma4_vocabulary_needs_its_merges():
    metadata = {key: value for key, value in METADATA.items() if key != "tokenizer.ggml.merges"}
    with pytest.raises(ModelLoadError, match=r"tokenizer\.ggml\.merges"):
        build_gguf_tokenizer(metadata)
