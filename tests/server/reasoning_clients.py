"""Apps on reasoning models: the tiny model with a thinking tokenizer, run by an engine over a
model that follows a script (`SuccessorModel`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from mlxcel_core.engine import Engine
from mlxcel_models.tokenizer import Tokenizer

from reasoning_factories import SuccessorModel, chain, make_tokenizer

ASK = [{"role": "user", "content": "Hi"}]
REASONING = "Plan"
ANSWER = "OK"


def scripted_engine(tokenizer: Tokenizer, *, opens_itself: bool = False) -> Engine:
    """An engine whose model replies `<think>Plan</think>OK` to any prompt ending in a
    newline, the opening marker left out when the template writes it."""
    think, end = tokenizer.encode("<think>"), tokenizer.encode("</think>")
    reply = [*(think if opens_itself else []), *tokenizer.encode(REASONING), *end]
    reply += tokenizer.encode(ANSWER)
    (newline,) = tokenizer.encode("\n")
    (im_end,) = tokenizer.encode("<|im_end|>")
    return Engine(SuccessorModel(chain(newline, reply), tokenizer.vocab_size, im_end))


def with_tokenizer(tiny_gguf, tiny_loaded, template: str):
    """The tiny model loaded with a thinking tokenizer using `template`."""
    return dataclasses.replace(tiny_loaded, tokenizer=make_tokenizer(tiny_gguf, template))


def joined(deltas: Sequence[dict], key: str) -> str:
    return "".join(d.get(key) or "" for d in deltas)
