"""Reasoning-model fixtures: a Qwen3-style thinking template, a tokenizer with `<think>` and
`</think>` as single tokens, and a model that follows a script so that replies reason.

A random model never writes reasoning markers, so `SuccessorModel` predicts, after each
token, the token a table names: its replies are a chosen token chain, whatever the budget
forces into them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import mlx.core as mx

from mlxcel_core.cache import DenseKVCache, KVCache
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.tokenizer import Tokenizer

# Qwen3-thinking style (as DeepSeek-R1's): the generation prompt opens the span, unless
# `enable_thinking` is false, which closes it at once. Tools as in Hermes/Qwen templates.
THINKING_TEMPLATE = """\
{%- if tools %}<|im_start|>system
# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call a function with <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' %}<|im_start|>assistant
{%- if message.reasoning_content %}
<think>
{{ message.reasoning_content }}
</think>
{%- endif %}
{{ message.content or '' }}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}
{%- endif %}"""

# The same without the switch: the model opens the span itself.
OPEN_THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    "{# replies may hold <think>...</think> #}"
)

# gpt-oss's harmony format, reduced to what the markers need.
HARMONY_TEMPLATE = (
    "{% for message in messages %}<|start|>{{ message.role }}<|message|>{{ message.content }}"
    "<|end|>{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
    "{# <|channel|>analysis ... <|channel|>final #}"
)
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>")

_USER_DEFINED = 4
_CONTROL = 3


def make_tokenizer(
    tiny_gguf: Path,
    template: str,
    *,
    user_tokens: Sequence[str] = ("<think>", "</think>"),
    special_tokens: Sequence[str] = (),
) -> Tokenizer:
    """The tiny model's byte-level tokenizer with `template` and extra whole tokens:
    `user_tokens` decoded as text (as Qwen3's `<think>`), `special_tokens` as control tokens
    (as gpt-oss's channel markers)."""
    metadata = dict(read_gguf_header(tiny_gguf, arrays=True).metadata)
    tokens = list(metadata["tokenizer.ggml.tokens"])
    types = list(metadata["tokenizer.ggml.token_type"])
    for text in user_tokens:
        tokens.append(text)
        types.append(_USER_DEFINED)
    for text in special_tokens:
        tokens.append(text)
        types.append(_CONTROL)
    metadata["tokenizer.ggml.tokens"] = tokens
    metadata["tokenizer.ggml.token_type"] = types
    metadata["tokenizer.chat_template"] = template
    return Tokenizer.from_gguf_metadata(metadata)


class SuccessorModel:
    """Predicts, after each token, `successors[token]` (else `default`), with certainty.

    Args:
        successors: the next token of each token that has one.
        vocab_size: V, the logits' width.
        default: the token predicted after any other token (an end-of-turn token).
    """

    def __init__(self, successors: Mapping[int, int], vocab_size: int, default: int) -> None:
        self.table = mx.array([successors.get(t, default) for t in range(vocab_size)])
        self.vocab_size = vocab_size

    def make_cache(self) -> list[KVCache]:
        return [DenseKVCache(step=8)]

    def __call__(self, tokens: mx.array, cache: Sequence[KVCache], *, last_only=False):
        B, L = tokens.shape
        cache[0].update_and_fetch(mx.zeros((B, 1, L, 1)), mx.zeros((B, 1, L, 1)))
        logits = 20.0 * mx.eye(self.vocab_size)[self.table[tokens]]
        return logits[:, -1:] if last_only else logits


def chain(first: int, following: Sequence[int]) -> dict[int, int]:
    """Successors that make `first` be followed by `following`, token by token.

    Raises:
        ValueError: a token would need two different successors.
    """
    successors: dict[int, int] = {}
    for previous, token in zip([first, *following], following, strict=False):
        if successors.setdefault(previous, token) != token:
            raise ValueError(
                f"token {previous} cannot be followed by both {successors[previous]} and {token}"
            )
    return successors
