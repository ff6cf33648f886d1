"""The tokenizer callers hold: encoding, decoding, chat templates and end-of-generation ids."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from tokenizers import Tokenizer as BackendTokenizer
from transformers import PreTrainedTokenizerFast

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.tokenizer.detokenizer import IncrementalDetokenizer
from mlxcel_models.tokenizer.gguf_vocab import build_gguf_tokenizer, gguf_adds_bos

END_OF_TURN_TOKENS = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "<|return|>",
    "<|call|>",
)
"""Texts of tokens that end generation when the vocabulary has them as special tokens.

llama.cpp's end-of-generation list (`llama-vocab.cpp`), less the tokens it drops per family
(`</s>`, `<eos>`): those end generation only where the model names them as its EOS.
"""

# Default ids llama.cpp assumes for a SentencePiece vocabulary that names none.
_SENTENCEPIECE_DEFAULT_IDS = {"bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0}


class Tokenizer:
    """A model's tokenizer, wrapping `transformers.PreTrainedTokenizerFast`.

    Chat templates render through transformers' `apply_chat_template`, so a template produces
    the same text here as in transformers; encoding and decoding go to the `tokenizers` backend.

    Args:
        hf_tokenizer: The transformers tokenizer.
        add_bos: Whether `encode` prepends BOS to a prompt (llama.cpp's `add_bos`).
        eos_token_ids: Ids that end generation.

    Raises:
        ValueError: `add_bos` is set but the tokenizer has no BOS token, or `eos_token_ids`
            holds an id outside the vocabulary.
    """

    def __init__(
        self,
        hf_tokenizer: PreTrainedTokenizerFast,
        *,
        add_bos: bool,
        eos_token_ids: Iterable[int],
    ) -> None:
        self._hf = hf_tokenizer
        self._backend: BackendTokenizer = hf_tokenizer.backend_tokenizer
        self._add_bos = add_bos
        self._eos_token_ids = frozenset(eos_token_ids)
        if add_bos and self.bos_token_id is None:
            raise ValueError("add_bos is True but the tokenizer has no BOS token")
        out_of_range = sorted(i for i in self._eos_token_ids if not 0 <= i < self.vocab_size)
        if out_of_range:
            raise ValueError(
                f"eos_token_ids must lie in [0, {self.vocab_size}), got {out_of_range}"
            )

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build the tokenizer a GGUF file describes.

        Args:
            metadata: The GGUF metadata (`read_gguf_header(path, arrays=True).metadata`).

        Raises:
            ModelLoadError: the vocabulary is unsupported or inconsistent (see
                `build_gguf_tokenizer`), or BOS is required but not named.
        """
        backend = build_gguf_tokenizer(metadata)
        tokens = metadata["tokenizer.ggml.tokens"]
        defaults = (
            _SENTENCEPIECE_DEFAULT_IDS if metadata.get("tokenizer.ggml.model") == "llama" else {}
        )

        def token_id(key: str) -> int | None:
            value = metadata.get(f"tokenizer.ggml.{key}", defaults.get(key))
            return value if value is not None and 0 <= value < len(tokens) else None

        add_bos = gguf_adds_bos(metadata)
        if add_bos and token_id("bos_token_id") is None:
            raise ModelLoadError(
                "GGUF tokenizer adds BOS (tokenizer.ggml.add_bos_token) but names no valid "
                "BOS token (tokenizer.ggml.bos_token_id)"
            )
        # transformers makes every named token special (matched whole, skipped in decode), so
        # only tokens the vocabulary already marks special are named; BOS too when it is added.
        special = set(_special_token_ids(backend).values())
        named = {
            name: tokens[index]
            for name, key in (
                ("bos_token", "bos_token_id"),
                ("eos_token", "eos_token_id"),
                ("unk_token", "unknown_token_id"),
                ("pad_token", "padding_token_id"),
            )
            if (index := token_id(key)) is not None
            and (index in special or (name == "bos_token" and add_bos))
        }
        hf_tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            chat_template=metadata.get("tokenizer.chat_template"),
            add_bos_token=add_bos,
            add_eos_token=False,
            clean_up_tokenization_spaces=False,
            **named,
        )
        explicit = {
            index
            for key in ("eos_token_id", "eot_token_id", "eom_token_id")
            if (index := token_id(key)) is not None
        }
        return cls(
            hf_tokenizer,
            add_bos=add_bos,
            eos_token_ids=explicit | _end_of_turn_ids(backend),
        )

    @classmethod
    def from_folder(cls, path: str | Path) -> Tokenizer:
        """Load the tokenizer of a Hugging Face / mlx-lm model folder.

        Reads `tokenizer.json` and `tokenizer_config.json`; the chat template comes from
        `tokenizer_config.json` or `chat_template.jinja`, else from a processor's
        `chat_template.json` (vision-language folders keep it there). End-of-generation
        ids add those of `generation_config.json` and `config.json` (`eos_token_id`, an id
        or a list) to the tokenizer's EOS. Nothing is downloaded.

        Raises:
            ModelLoadError: the folder has no `tokenizer.json`, or its files cannot be read
                or do not describe a usable tokenizer.
        """
        folder = Path(path)
        if not (folder / "tokenizer.json").is_file():
            raise ModelLoadError(f"no tokenizer.json in {folder}")
        try:
            return cls._from_folder_files(folder)
        except ModelLoadError:
            raise
        # transformers and tokenizers raise whatever their parsing meets in a malformed file
        # (KeyError for a missing field, tokenizers' bare Exception for a vocabulary without
        # its unknown token), so at this boundary any error means an unusable tokenizer.
        except Exception as error:
            raise ModelLoadError(
                f"cannot load the tokenizer in {folder}: {type(error).__name__}: {error}"
            ) from error

    @classmethod
    def _from_folder_files(cls, folder: Path) -> Tokenizer:
        hf_tokenizer = PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
        if hf_tokenizer.chat_template is None:
            hf_tokenizer.chat_template = _processor_chat_template(folder)
        backend = hf_tokenizer.backend_tokenizer
        explicit = {hf_tokenizer.eos_token_id} - {None}
        for name in ("generation_config.json", "config.json"):
            explicit |= _configured_eos_ids(folder / name)
        return cls(
            hf_tokenizer,
            add_bos=_post_processor_adds_bos(backend, hf_tokenizer.bos_token_id),
            eos_token_ids=explicit | _end_of_turn_ids(backend),
        )

    @property
    def hf_tokenizer(self) -> PreTrainedTokenizerFast:
        """The wrapped transformers tokenizer (for libraries such as mlx-lm that take one)."""
        return self._hf

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        """The BOS token id, or None when the model has none."""
        return self._hf.bos_token_id

    @property
    def add_bos(self) -> bool:
        """Whether `encode` prepends BOS to a prompt."""
        return self._add_bos

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end generation: EOS and the model's end-of-turn tokens."""
        return self._eos_token_ids

    @property
    def chat_template(self) -> str | None:
        """The default chat template (Jinja): the model's own, or None when it ships none,
        until one is set in its place."""
        template = self._hf.chat_template
        if isinstance(template, dict):
            return template.get("default")
        return template

    @chat_template.setter
    def chat_template(self, template: str) -> None:
        self._hf.chat_template = template

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in the text are matched whole.

        Args:
            text: The text to encode.
            add_special_tokens: Prepend BOS when the model wants it (`add_bos`).
        """
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self._add_bos:
            return [self._hf.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of `ids`.

        Args:
            ids: Token ids.
            skip_special_tokens: Leave out special (control) tokens, as llama-server does for
                generated text unless asked to render them; user-defined tokens are kept.
        """
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """Render a conversation to prompt text with transformers' `apply_chat_template`.

        Args:
            messages: OpenAI-style messages (`role`, `content`, ...).
            add_generation_prompt: End with the header that opens the assistant's turn.
            chat_template: Jinja text to use instead of the model's (see
                `resolve_chat_template` for names).
            tools: Tool (function) definitions, passed to the template as `tools`.
            template_kwargs: Extra template variables (e.g. `enable_thinking`).

        Raises:
            ValueError: neither `chat_template` nor the model provides a template, or the
                template rejects the conversation (e.g. roles that do not alternate).
        """
        template = chat_template if chat_template is not None else self.chat_template
        if template is None:
            raise ValueError(
                "the model has no chat template; pass chat_template (a Jinja template or a "
                "built-in name such as 'chatml')"
            )
        try:
            return self._hf.apply_chat_template(
                [dict(message) for message in messages],
                tools=[dict(tool) for tool in tools] if tools is not None else None,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **(template_kwargs or {}),
            )
        # A chat template is a program: besides Jinja's own errors it can raise the Python
        # errors of the operations it runs (1/0, a bad operand, a sandbox range limit).
        except (TemplateError, ArithmeticError, TypeError, LookupError, ValueError) as error:
            raise ValueError(f"the chat template cannot render these messages: {error}") from error

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a rendered conversation (arguments as `apply_chat_template`).

        BOS is prepended when the model wants it and the template did not already write it.
        """
        text = self.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            chat_template=chat_template,
            tools=tools,
            template_kwargs=template_kwargs,
        )
        ids = self.encode(text, add_special_tokens=False)
        if self._add_bos and ids[:1] != [self._hf.bos_token_id]:
            return [self._hf.bos_token_id, *ids]
        return ids

    @cached_property
    def _token_texts(self) -> list[str]:
        return self._backend.decode_batch(
            [[index] for index in range(self.vocab_size)], skip_special_tokens=False
        )

    def token_ids_containing(self, strings: Iterable[str]) -> frozenset[int]:
        """Ids of the tokens whose text contains any of `strings` (e.g. DRY sequence breakers).

        Raises:
            ValueError: one of `strings` is empty.
        """
        needles = tuple(strings)
        if "" in needles:
            raise ValueError(f"strings must be non-empty, got {needles!r}")
        return frozenset(
            index
            for index, text in enumerate(self._token_texts)
            if any(needle in text for needle in needles)
        )

    def make_detokenizer(self, *, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A fresh incremental detokenizer over this tokenizer (see `decode`)."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)


def _special_token_ids(backend: BackendTokenizer) -> dict[str, int]:
    return {
        token.content: index
        for index, token in backend.get_added_tokens_decoder().items()
        if token.special
    }


def _end_of_turn_ids(backend: BackendTokenizer) -> set[int]:
    # Only special tokens count: a normal token that merely spells one of these texts can be
    # part of ordinary output (code, markup) and must not stop generation.
    special = _special_token_ids(backend)
    names = set(END_OF_TURN_TOKENS)
    # In OpenAI's harmony format `<|end|>` closes one message of several; `<|return|>` ends.
    if "<|return|>" in special:
        names.discard("<|end|>")
    return {index for text, index in special.items() if text in names}


def _post_processor_adds_bos(backend: BackendTokenizer, bos_token_id: int | None) -> bool:
    if bos_token_id is None:
        return False
    plain = backend.encode("a", add_special_tokens=False).ids
    processed = backend.encode("a", add_special_tokens=True).ids
    return processed[:1] == [bos_token_id] and plain[:1] != [bos_token_id]


def _configured_eos_ids(path: Path) -> set[int]:
    if not path.is_file():
        return set()
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from error
    if value is None:
        return set()
    return {value} if isinstance(value, int) else set(value)


def _processor_chat_template(folder: Path) -> str | None:
    """The template in a processor's `chat_template.json` (`{"chat_template": ...}`), or
    None without one.

    Raises:
        ModelLoadError: the file exists but holds no template text.
    """
    path = folder / "chat_template.json"
    if not path.is_file():
        return None
    try:
        template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from error
    if not isinstance(template, str):
        raise ModelLoadError(f"{path} holds no chat_template text")
    return template
