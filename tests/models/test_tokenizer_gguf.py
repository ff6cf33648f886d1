"""Tokenizers rebuilt from GGUF metadata, checked against llama.cpp's own token ids.

The ids in `data/*_llama_cpp_ids.json` were produced by llama.cpp (through llama-cpp-python,
`tokenize(add_bos=False, special=True)`) on the same vocabularies.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.tokenizer import Tokenizer, build_gguf_tokenizer
from mlxcel_models.tokenizer.gguf_vocab import PRE_TOKENIZER_RULES, gguf_adds_bos

DATA = Path(__file__).parent / "data"
SMOLLM2_CASES = json.loads((DATA / "smollm2_llama_cpp_ids.json").read_text())["cases"]
PRE_TOKENIZER_CASES = json.loads((DATA / "pre_tokenizer_llama_cpp_ids.json").read_text())["cases"]
SENTENCEPIECE = json.loads((DATA / "sentencepiece_llama_cpp_ids.json").read_text())

ROUND_TRIP_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # sum\n\n\tclass X: pass\r\n",
    "Emoji 😀👍🏽🇫🇷 and a family 👨\u200d👩\u200d👧",
    "日本語のテキストと中文文本\uff0c한국어도.",
    "Accents: café naïve résumé Ærøskøbing Ünïcödé e\u0301",
    "  leading, trailing   and   inner runs of spaces   \n\n\n",
    "",
]


@pytest.fixture(scope="module")
def smollm2_metadata(smollm2_path: Path) -> dict[str, Any]:
    return read_gguf_header(smollm2_path, arrays=True).metadata


@pytest.fixture(scope="module")
def smollm2(smollm2_metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(smollm2_metadata)


@pytest.mark.parametrize("case", SMOLLM2_CASES, ids=lambda case: repr(case["text"])[:40])
def test_smollm2_ids_match_llama_cpp(smollm2: Tokenizer, case: dict[str, Any]):
    assert smollm2.encode(case["text"]) == case["ids"]


def test_smollm2_splits_digits_one_per_token(smollm2: Tokenizer):
    ids = smollm2.encode("2024 and 1234567")
    digit_pieces = [smollm2.decode([i]) for i in ids if smollm2.decode([i]).strip().isdigit()]
    assert digit_pieces == list("20241234567")


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_smollm2_round_trips(smollm2: Tokenizer, text: str):
    assert smollm2.decode(smollm2.encode(text)) == text


def test_smollm2_special_tokens_encode_whole(smollm2: Tokenizer):
    assert smollm2.encode("<|im_start|>") == [1]
    assert smollm2.encode("<|im_end|>") == [2]
    assert smollm2.encode("<|endoftext|>") == [0]
    ids = smollm2.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and ids.count(1) == 1


def test_smollm2_special_token_facts(smollm2: Tokenizer):
    assert smollm2.vocab_size == 49152
    assert smollm2.bos_token_id == 1
    assert smollm2.add_bos is False
    assert smollm2.encode("Hello") == smollm2.encode("Hello", add_special_tokens=False)
    assert smollm2.eos_token_ids == frozenset({0, 2})


def test_smollm2_decode_skips_control_tokens_unless_asked(smollm2: Tokenizer):
    ids = smollm2.encode("<|im_start|>assistant\nParis.<|im_end|>")
    assert smollm2.decode(ids) == "assistant\nParis."
    assert (
        smollm2.decode(ids, skip_special_tokens=False) == "<|im_start|>assistant\nParis.<|im_end|>"
    )


def test_smollm2_chat_prompt_is_exact_chatml(smollm2: Tokenizer):
    user = [{"role": "user", "content": "What is the capital of France?"}]
    default_system = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
        "trained by Hugging Face<|im_end|>\n"
    )
    question = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    assert smollm2.apply_chat_template(user) == (
        default_system + question + "<|im_start|>assistant\n"
    )
    system = [{"role": "system", "content": "Be brief."}, *user]
    assert smollm2.apply_chat_template(system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n" + question
    )


def test_smollm2_encode_chat_tokenizes_the_rendered_prompt(smollm2: Tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    ids = smollm2.encode_chat(messages)
    assert ids == smollm2.encode(smollm2.apply_chat_template(messages))
    assert ids[0] == 1 and ids[-4:] == [1, *smollm2.encode("assistant\n")]


def test_token_ids_containing_finds_newline_tokens(smollm2: Tokenizer):
    newline = smollm2.token_ids_containing(["\n"])
    assert smollm2.encode("\n") == [198] and 198 in newline
    assert all("\n" in smollm2.decode([i], skip_special_tokens=False) for i in newline)
    assert smollm2.encode("Hello")[0] not in newline
    assert smollm2.token_ids_containing(["\n", "*"]) > newline
    with pytest.raises(ValueError, match="strings"):
        smollm2.token_ids_containing([""])


@pytest.mark.parametrize("pre", ["default", "gpt-2", "llama-bpe", "qwen2", "tekken", "gpt-4o"])
def test_pre_tokenizers_match_llama_cpp(smollm2_metadata: dict[str, Any], pre: str):
    tokenizer = build_gguf_tokenizer({**smollm2_metadata, "tokenizer.ggml.pre": pre})
    for case in PRE_TOKENIZER_CASES:
        ids = tokenizer.encode(case["text"], add_special_tokens=False).ids
        assert ids == case["ids"][pre], case["text"]


def test_missing_pre_tokenizer_is_default(smollm2_metadata: dict[str, Any]):
    metadata = {k: v for k, v in smollm2_metadata.items() if k != "tokenizer.ggml.pre"}
    tokenizer = build_gguf_tokenizer(metadata)
    for case in PRE_TOKENIZER_CASES:
        assert tokenizer.encode(case["text"]).ids == case["ids"]["default"], case["text"]


def test_unknown_pre_tokenizer_is_named_with_the_supported_ones(smollm2_metadata):
    with pytest.raises(ModelLoadError, match=r"'no-such-pre'.*smollm") as error:
        build_gguf_tokenizer({**smollm2_metadata, "tokenizer.ggml.pre": "no-such-pre"})
    assert all(name in str(error.value) for name in PRE_TOKENIZER_RULES)


def test_unknown_tokenizer_model_is_named(smollm2_metadata):
    with pytest.raises(ModelLoadError, match="'bert'"):
        build_gguf_tokenizer({**smollm2_metadata, "tokenizer.ggml.model": "bert"})


def test_add_bos_follows_llama_cpp_defaults(smollm2_metadata):
    without_flag = {
        k: v for k, v in smollm2_metadata.items() if k != "tokenizer.ggml.add_bos_token"
    }
    assert gguf_adds_bos({**without_flag, "tokenizer.ggml.pre": "llama-bpe"}) is True
    assert gguf_adds_bos({**without_flag, "tokenizer.ggml.pre": "qwen2"}) is False
    assert gguf_adds_bos({**without_flag, "tokenizer.ggml.model": "llama"}) is True
    assert gguf_adds_bos({**smollm2_metadata, "tokenizer.ggml.pre": "llama-bpe"}) is False


def test_a_normal_token_named_as_padding_stays_normal(smollm2_metadata):
    tokenizer = Tokenizer.from_gguf_metadata(
        {**smollm2_metadata, "tokenizer.ggml.padding_token_id": 17}
    )
    assert tokenizer.decode(tokenizer.encode("Hi!")) == "Hi!"


def test_folder_tokenizer_matches_gguf_one(smollm2: Tokenizer, tmp_path: Path):
    smollm2.hf_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    folder = Tokenizer.from_folder(tmp_path)
    text = "Hello 2024 😀 <|im_start|>user"
    assert folder.encode(text) == smollm2.encode(text)
    assert folder.chat_template == smollm2.chat_template
    assert folder.bos_token_id == 1 and folder.add_bos is False
    assert folder.eos_token_ids == frozenset({0, 2, 7})


def test_folder_chat_template_from_tokenizer_config(smollm2: Tokenizer, tmp_path: Path):
    smollm2.hf_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}!"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    folder = Tokenizer.from_folder(tmp_path)
    assert folder.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"


def test_folder_without_tokenizer_json_is_a_load_error(tmp_path: Path):
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json"):
        Tokenizer.from_folder(tmp_path)


def _word_level_without_its_unknown_token(folder: Path) -> None:
    backend = BackendTokenizer(models.WordLevel({"<s>": 0, "hello": 1}, unk_token="[UNK]"))
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))


@pytest.mark.parametrize(
    ("write", "cause"),
    [
        # transformers' KeyError 'added_tokens'
        (lambda folder: (folder / "tokenizer.json").write_text("{}"), "added_tokens"),
        # tokenizers' bare Exception, raised while probing whether BOS is added
        (_word_level_without_its_unknown_token, r"Missing \[UNK\] token"),
    ],
    ids=["empty-json", "unknown-token-not-in-vocabulary"],
)
def test_folder_tokenizer_that_cannot_be_built_is_a_load_error(tmp_path: Path, write, cause):
    write(tmp_path)
    with pytest.raises(
        ModelLoadError, match=rf"cannot load the tokenizer in {re.escape(str(tmp_path))}: .*{cause}"
    ):
        Tokenizer.from_folder(tmp_path)


# A SentencePiece vocabulary built by hand: scores decide which merges win.
def _tiny_sentencepiece_metadata() -> dict[str, Any]:
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{byte:02X}>", 0.0, 6) for byte in range(256)]
    pieces += [
        ("\u2581", -1.0, 1),
        ("a", -2.0, 1),
        ("b", -2.0, 1),
        ("c", -2.0, 1),
        ("h", -2.0, 1),
        ("i", -2.0, 1),
        ("ab", -3.0, 1),
        ("bc", -4.0, 1),
        ("\u2581h", -5.0, 1),
        ("\u2581hi", -6.0, 1),
        ("<tool>", 0.0, 4),
    ]
    tokens, scores, types = (list(column) for column in zip(*pieces, strict=True))
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.chat_template": (
            "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
        ),
    }


@pytest.fixture(scope="module")
def tiny_sentencepiece() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(_tiny_sentencepiece_metadata())


def test_tiny_sentencepiece_encodes_by_score(tiny_sentencepiece: Tokenizer):
    tokens = _tiny_sentencepiece_metadata()["tokenizer.ggml.tokens"]
    pieces = [tokens[i] for i in tiny_sentencepiece.encode("hi abc", add_special_tokens=False)]
    # "ab" outscores "bc", so "abc" is "ab" + "c"; the space before it stands alone.
    assert pieces == ["\u2581hi", "\u2581", "ab", "c"]


def test_tiny_sentencepiece_falls_back_to_bytes(tiny_sentencepiece: Tokenizer):
    tokens = _tiny_sentencepiece_metadata()["tokenizer.ggml.tokens"]
    ids = tiny_sentencepiece.encode("hé", add_special_tokens=False)
    assert [tokens[i] for i in ids] == ["\u2581h", "<0xC3>", "<0xA9>"]
    assert tiny_sentencepiece.decode(ids) == "hé"


def test_tiny_sentencepiece_bos_and_added_tokens(tiny_sentencepiece: Tokenizer):
    assert tiny_sentencepiece.add_bos is True and tiny_sentencepiece.bos_token_id == 1
    ids = tiny_sentencepiece.encode("hi<tool>")
    assert ids[0] == 1 and ids[-1] == 269
    assert tiny_sentencepiece.decode(ids) == "hi<tool>"
    assert tiny_sentencepiece.eos_token_ids == frozenset({2})


def test_sentencepiece_folder_keeps_bos(tiny_sentencepiece: Tokenizer, tmp_path: Path):
    tiny_sentencepiece.hf_tokenizer.save_pretrained(tmp_path)
    folder = Tokenizer.from_folder(tmp_path)
    assert folder.add_bos is True and folder.bos_token_id == 1
    assert folder.encode("hi abc<tool>") == tiny_sentencepiece.encode("hi abc<tool>")
    assert folder.decode(folder.encode("hé abc")) == "hé abc"


def test_sentencepiece_chat_does_not_double_bos(tiny_sentencepiece: Tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    assert tiny_sentencepiece.apply_chat_template(messages) == "<s>hi"
    assert tiny_sentencepiece.encode_chat(messages).count(1) == 1
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tiny_sentencepiece.encode_chat(messages, chat_template=plain)[0] == 1


@pytest.mark.parametrize("add_space_prefix", [True, False])
def test_trained_sentencepiece_matches_llama_cpp(add_space_prefix: bool):
    metadata = {**SENTENCEPIECE["metadata"], "tokenizer.ggml.add_space_prefix": add_space_prefix}
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    key = "ids" if add_space_prefix else "ids_without_space_prefix"
    for case in SENTENCEPIECE["cases"]:
        ids = tokenizer.encode(case["text"], add_special_tokens=False)
        assert ids == case[key], case["text"]
        if add_space_prefix and "<" not in case["text"]:
            assert tokenizer.decode(ids) == case["text"]


def test_folder_chat_template_from_a_processors_chat_template_json(
    smollm2: Tokenizer, tmp_path: Path
):
    smollm2.hf_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink()
    template = "{{ messages[0]['content'] }}?"
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    folder = Tokenizer.from_folder(tmp_path)
    assert folder.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi?"
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": 3}))
    with pytest.raises(ModelLoadError, match=r"chat_template\.json holds no chat_template"):
        Tokenizer.from_folder(tmp_path)
