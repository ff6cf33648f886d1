"""Tokenizers: GGUF vocabularies, chat templates and incremental detokenization."""

from mlxcel_models.tokenizer.chat_templates import BUILTIN_CHAT_TEMPLATES, resolve_chat_template
from mlxcel_models.tokenizer.detokenizer import IncrementalDetokenizer, TokenDecoder
from mlxcel_models.tokenizer.gguf_vocab import build_gguf_tokenizer
from mlxcel_models.tokenizer.tokenizer import END_OF_TURN_TOKENS, Tokenizer

__all__ = [
    "BUILTIN_CHAT_TEMPLATES",
    "END_OF_TURN_TOKENS",
    "IncrementalDetokenizer",
    "TokenDecoder",
    "Tokenizer",
    "build_gguf_tokenizer",
    "resolve_chat_template",
]
