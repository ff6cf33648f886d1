"""A LLaVA model through the continuous-batching engine: image requests batched with text
requests, prefilled in chunks and served from the prefix cache, give the tokens of a plain
greedy loop, and a repeated image is encoded once."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest
from engine_runs import greedy_alone, greedy_request, run_engine, tokens_of
from PIL import Image
from test_vision_model import CountingEncoder

from mlxcel_core.engine import EngineConfig, SchedulerConfig
from mlxcel_core.request import GenerationConfig
from mlxcel_models.compute import ComputeOptions
from mlxcel_vision.loading import load_vision_model
from mlxcel_vision.model import VisionLanguageModel

GENERATION = GenerationConfig(context_size=64, max_tokens=8)
CONFIG = EngineConfig(
    scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_chunk=8),
    context_size=64,
    block_size=4,
    num_kv_blocks=64,
)


@pytest.fixture(scope="module")
def loaded(tiny_llava):
    return load_vision_model(tiny_llava, compute=ComputeOptions(float_dtype=mx.float32))


def test_image_and_text_requests_in_the_engine_match_a_greedy_loop(loaded):
    model = loaded.model
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 70, 3), np.uint8))
    chat = "<|im_start|>user\n<image>what is it?<|im_end|>\n<|im_start|>assistant\n"
    image_prompt = loaded.image_prompter.encode(chat, [picture])
    text_prompt = loaded.image_prompter.encode("<|im_start|>user\nhello<|im_end|>\n", [])
    encoder = CountingEncoder(model.parts.encoder)
    counting = VisionLanguageModel(dataclasses.replace(model.parts, encoder=encoder))

    # Batched with a text request, prefilled in chunks of 8 (the image spans three); then
    # the same image again, its prompt's blocks from the prefix cache.
    first, text, again = run_engine(
        counting,
        CONFIG,
        [
            [
                greedy_request(image_prompt, 0, GENERATION),
                greedy_request(text_prompt, 1, GENERATION),
            ],
            [greedy_request(image_prompt, 2, GENERATION)],
        ],
    )
    assert tokens_of(first) == greedy_alone(model, image_prompt, GENERATION.max_tokens)
    assert tokens_of(text) == greedy_alone(model, text_prompt, GENERATION.max_tokens)
    assert tokens_of(again) == tokens_of(first)
    assert again[-1].stats.cached_tokens > image_prompt.images[0].stop
    assert encoder.calls == 1
