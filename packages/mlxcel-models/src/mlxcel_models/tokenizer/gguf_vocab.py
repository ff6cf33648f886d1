"""Rebuilding a `tokenizers.Tokenizer` from the vocabulary a GGUF file stores as metadata.

A GGUF carries no `tokenizer.json`: it stores the tokens, their types, the BPE merges or the
SentencePiece scores, and names the pre-tokenizer. This module turns those back into a
`tokenizers.Tokenizer` that tokenizes as llama.cpp does (`src/llama-vocab.cpp`):

- `tokenizer.ggml.model == "gpt2"`: byte-level BPE. The text is split by llama.cpp's regexes for
  `tokenizer.ggml.pre`, each applied in turn to every piece the previous one left, keeping both
  matches and the text between them; then bytes are mapped to GPT-2's printable alphabet.
- `tokenizer.ggml.model == "llama"`: SentencePiece BPE with byte fallback, shaped like the
  `tokenizer.json` of Llama 2: spaces become `▁` (with one prepended when
  `tokenizer.ggml.add_space_prefix`), and merges are recovered from the vocabulary and scores as
  transformers' SentencePiece extractor does.
- `tokenizer.ggml.model == "gemma4"`: BPE over UTF-8 characters with the stored merges and byte
  fallback: spaces become `▁` (none prepended), and the text is split only into runs of newlines
  and runs of everything else (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_GEMMA4`, no byte encoding).

Control and unknown tokens become special added tokens and user-defined ones plain added tokens,
so both are matched whole in the text instead of being split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from mlxcel_models.errors import ModelLoadError

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_SPIECE_SPACE = "\u2581"

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# Contractions spelled out as llama.cpp does: `(?i:...)` would also match Unicode case-folding
# variants such as the long s (U+017F).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5's: Qwen 2's with combining marks (`\p{M}`) kept with the letters before them.
_QWEN35_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    + _CONTRACTIONS
    + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizerRule:
    """How llama.cpp pre-tokenizes text for one `tokenizer.ggml.pre` value.

    Attributes:
        regexes: Patterns applied in order; each splits every piece left by the previous ones
            into its matches and the text between them.
        ignore_merges: A pre-token that is itself in the vocabulary is emitted whole, without
            running the merges (Llama 3, Tekken).
        add_bos: Whether llama.cpp adds BOS by default when the file does not say.
    """

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False

    def __post_init__(self) -> None:
        if not self.regexes:
            raise ValueError("regexes must name at least one pattern, got none")


_DEFAULT_RULE = PreTokenizerRule(
    (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]")
)
_GPT2_RULE = PreTokenizerRule((_GPT2_SPLIT,))
_DIGITS_GPT2_RULE = PreTokenizerRule((r"\p{N}", _GPT2_SPLIT))
_LLAMA3_RULE = PreTokenizerRule((_LLAMA3_SPLIT,), ignore_merges=True, add_bos=True)
_QWEN2_RULE = PreTokenizerRule((_QWEN2_SPLIT,))

PRE_TOKENIZER_RULES: Mapping[str, PreTokenizerRule] = MappingProxyType(
    {
        "default": _DEFAULT_RULE,
        "gpt-2": _GPT2_RULE,
        "phi-2": _GPT2_RULE,
        "mpt": _GPT2_RULE,
        "olmo": _GPT2_RULE,
        "smollm": _DIGITS_GPT2_RULE,
        "starcoder": _DIGITS_GPT2_RULE,
        "refact": _DIGITS_GPT2_RULE,
        "command-r": _DIGITS_GPT2_RULE,
        "codeshell": _DIGITS_GPT2_RULE,
        "exaone": _DIGITS_GPT2_RULE,
        "llama3": _LLAMA3_RULE,
        "llama-v3": _LLAMA3_RULE,
        "llama-bpe": _LLAMA3_RULE,
        "falcon3": _LLAMA3_RULE,
        "pixtral": _LLAMA3_RULE,
        "dbrx": PreTokenizerRule((_LLAMA3_SPLIT,)),
        "smaug-bpe": PreTokenizerRule((_LLAMA3_SPLIT,)),
        "qwen2": _QWEN2_RULE,
        "qwen35": PreTokenizerRule((_QWEN35_SPLIT,)),
        "deepseek-r1-qwen": _QWEN2_RULE,
        "stablelm2": _QWEN2_RULE,
        "megrez": _QWEN2_RULE,
        "tekken": PreTokenizerRule((_TEKKEN_SPLIT,), ignore_merges=True, add_bos=True),
        "gpt-4o": PreTokenizerRule((_GPT4O_SPLIT,)),
        "llama4": PreTokenizerRule((_GPT4O_SPLIT,)),
    }
)
"""llama.cpp's pre-tokenizers by `tokenizer.ggml.pre` name (a subset of `llama-vocab.cpp`)."""


def pre_tokenizer_rule(metadata: Mapping[str, Any]) -> PreTokenizerRule:
    """The pre-tokenizer rule a byte-level BPE vocabulary names; `default` when it names none.

    Raises:
        ModelLoadError: `tokenizer.ggml.pre` names a pre-tokenizer this module does not know.
    """
    name = metadata.get("tokenizer.ggml.pre") or "default"
    rule = PRE_TOKENIZER_RULES.get(name)
    if rule is None:
        raise ModelLoadError(
            f"unsupported GGUF pre-tokenizer {name!r} (tokenizer.ggml.pre); "
            f"supported: {', '.join(sorted(PRE_TOKENIZER_RULES))}"
        )
    return rule


def gguf_adds_bos(metadata: Mapping[str, Any]) -> bool:
    """Whether llama.cpp prepends BOS when tokenizing a prompt for this vocabulary.

    `tokenizer.ggml.add_bos_token` decides when present; otherwise SentencePiece vocabularies
    and the byte-level ones whose pre-tokenizer llama.cpp flags (Llama 3, Tekken) add it.
    """
    if "tokenizer.ggml.add_bos_token" in metadata:
        return bool(metadata["tokenizer.ggml.add_bos_token"])
    model = metadata.get("tokenizer.ggml.model")
    if model == "llama":
        return True
    return model == "gpt2" and pre_tokenizer_rule(metadata).add_bos


def build_gguf_tokenizer(metadata: Mapping[str, Any]) -> Tokenizer:
    """Rebuild the tokenizer described by GGUF metadata.

    Args:
        metadata: GGUF key/value metadata as plain Python values, holding at least
            `tokenizer.ggml.model` and `tokenizer.ggml.tokens`, plus `tokenizer.ggml.merges`
            (byte-level BPE) or `tokenizer.ggml.scores` (SentencePiece).

    Returns:
        A tokenizer whose ids are the GGUF token ids. It has no post-processor: callers add BOS.

    Raises:
        ModelLoadError: the tokenizer model or pre-tokenizer is unsupported, or a required key is
            missing or inconsistent.
    """
    model = metadata.get("tokenizer.ggml.model")
    tokens = list(_required(metadata, "tokenizer.ggml.tokens"))
    types = _token_types(metadata, len(tokens))
    if model not in ("gpt2", "llama", "gemma4"):
        raise ModelLoadError(
            f"unsupported GGUF tokenizer model {model!r} (tokenizer.ggml.model); "
            "supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece), "
            "'gemma4' (BPE over characters)"
        )
    try:
        if model == "gpt2":
            tokenizer = _build_byte_level_bpe(metadata, tokens)
        elif model == "gemma4":
            tokenizer = _build_gemma4_bpe(metadata, tokens)
        else:
            tokenizer = _build_sentencepiece_bpe(metadata, tokens, types)
    # The tokenizers library reports an inconsistent vocabulary as a bare Exception.
    except Exception as error:
        raise ModelLoadError(f"inconsistent GGUF vocabulary: {error}") from error
    tokenizer.add_special_tokens(
        [
            _added_token(text, special=True)
            for text, token_type in zip(tokens, types, strict=True)
            if token_type in (TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL)
        ]
    )
    tokenizer.add_tokens(
        [
            _added_token(text, special=False)
            for text, token_type in zip(tokens, types, strict=True)
            if token_type == TOKEN_TYPE_USER_DEFINED
        ]
    )
    return tokenizer


def _added_token(text: str, *, special: bool) -> AddedToken:
    return AddedToken(text, special=special, normalized=False, lstrip=False, rstrip=False)


def _required(metadata: Mapping[str, Any], key: str) -> Any:
    if key not in metadata:
        raise ModelLoadError(f"GGUF tokenizer metadata lacks {key}")
    return metadata[key]


def _per_token(metadata: Mapping[str, Any], key: str, num_tokens: int) -> list[Any]:
    values = list(_required(metadata, key))
    if len(values) < num_tokens:
        raise ModelLoadError(f"GGUF {key} has {len(values)} entries for {num_tokens} tokens")
    return values[:num_tokens]


def _token_types(metadata: Mapping[str, Any], num_tokens: int) -> list[int]:
    if "tokenizer.ggml.token_type" not in metadata:
        return [TOKEN_TYPE_NORMAL] * num_tokens
    return _per_token(metadata, "tokenizer.ggml.token_type", num_tokens)


def _vocabulary(tokens: Sequence[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for index, text in enumerate(tokens):
        if text in vocab:
            raise ModelLoadError(
                f"duplicate token in GGUF vocabulary: {text!r} has ids {vocab[text]} and {index}"
            )
        vocab[text] = index
    return vocab


def _split_merge(merge: str) -> tuple[str, str]:
    # The separator is searched from index 1, as in llama.cpp, so a merge whose left part is
    # itself a space still splits in the right place.
    position = merge.find(" ", 1)
    if position < 0:
        raise ModelLoadError(f"malformed GGUF merge {merge!r}: no space separating its parts")
    return merge[:position], merge[position + 1 :]


def _build_byte_level_bpe(metadata: Mapping[str, Any], tokens: Sequence[str]) -> Tokenizer:
    rule = pre_tokenizer_rule(metadata)
    merges = [_split_merge(merge) for merge in _required(metadata, "tokenizer.ggml.merges")]
    tokenizer = Tokenizer(
        models.BPE(vocab=_vocabulary(tokens), merges=merges, ignore_merges=rule.ignore_merges)
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in rule.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def sentencepiece_merges(
    tokens: Sequence[str], scores: Sequence[float], mergeable: Sequence[bool]
) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary, best first.

    Every mergeable token that splits into two mergeable tokens yields one merge per split;
    merges are ordered by the score of the token they form, highest first, as SentencePiece's
    BPE merges the adjacent pair whose union scores best (the order transformers'
    `generate_merges` gives when passed scores).

    Args:
        tokens: Token texts by id.
        scores: Token scores by id (higher merges earlier).
        mergeable: Per id, whether the token takes part in merges (normal tokens only).

    Returns:
        `(left, right)` pairs, highest priority first.
    """
    candidates = {text: index for index, text in enumerate(tokens) if mergeable[index]}
    ranked: list[tuple[float, int, int, str, str]] = []
    for text, index in candidates.items():
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in candidates and right in candidates:
                ranked.append((-scores[index], index, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _build_sentencepiece_bpe(
    metadata: Mapping[str, Any], tokens: Sequence[str], types: Sequence[int]
) -> Tokenizer:
    scores = _per_token(metadata, "tokenizer.ggml.scores", len(tokens))
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id", 0)
    tokenizer = Tokenizer(
        models.BPE(
            vocab=_vocabulary(tokens),
            merges=sentencepiece_merges(
                tokens, scores, [token_type == TOKEN_TYPE_NORMAL for token_type in types]
            ),
            unk_token=tokens[unk_id] if 0 <= unk_id < len(tokens) else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    replace_spaces = normalizers.Replace(" ", _SPIECE_SPACE)
    steps = [decoders.Replace(_SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if metadata.get("tokenizer.ggml.add_space_prefix", True):
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Prepend(_SPIECE_SPACE), replace_spaces]
        )
        steps.append(decoders.Strip(" ", 1, 0))
    else:
        tokenizer.normalizer = replace_spaces
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _build_gemma4_bpe(metadata: Mapping[str, Any], tokens: Sequence[str]) -> Tokenizer:
    merges = [_split_merge(merge) for merge in _required(metadata, "tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab=_vocabulary(tokens), merges=merges, byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", _SPIECE_SPACE)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(_SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tokenizer
