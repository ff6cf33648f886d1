"""Fixtures shared by the command tests."""

from __future__ import annotations

import dataclasses

import pytest

from mlxcel_models.loading.loader import load_model

from reasoning_factories import THINKING_TEMPLATE, SuccessorModel, chain, make_tokenizer


@pytest.fixture(scope="module")
def thinking_model(tiny_gguf):
    """The tiny model with a thinking template, its network replaced by one that replies
    `Plan</think>OK` after the template's `<think>\\n`."""
    tokenizer = make_tokenizer(tiny_gguf, THINKING_TEMPLATE)
    reply = [*tokenizer.encode("Plan</think>OK")]
    (newline,) = tokenizer.encode("\n")
    (im_end,) = tokenizer.encode("<|im_end|>")
    model = SuccessorModel(chain(newline, reply), tokenizer.vocab_size, im_end)
    return dataclasses.replace(load_model(tiny_gguf), model=model, tokenizer=tokenizer)
