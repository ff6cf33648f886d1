"""A LLaVA model through the continuous-batching engine: image requests batched with text
requests, prefilled in chunks and served from the prefix cache, give the tokens of a plain
greedy loop, and a repeated image is encoded once."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image
from test_vision_model import CountingEncoder

from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineOutput,
    EngineRequest,
    OutputQueue,
    SchedulerConfig,
)
from mlxcel_core.generate import GenerationConfig
from mlxcel_core.images import RowImages
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.image_prompt import ImagePrompt
from mlxcel_vision.loading import load_vision_model
from mlxcel_vision.model import VisionLanguageModel

GREEDY = SamplingParams(temperature=0.0)
GENERATION = GenerationConfig(context_size=64, max_tokens=8)
TIMEOUT = 60.0


class NullDetokenizer:
    def add_token(self, token_id: int) -> str:
        return ""

    def finalize(self) -> str:
        return ""


@pytest.fixture(scope="module")
def loaded(tiny_llava):
    return load_vision_model(tiny_llava, compute=ComputeOptions(float_dtype=mx.float32))


def greedy_alone(model, prompt) -> list[int]:
    """Greedy tokens from a loop over dense caches, the images given to every pass."""
    ids, tokens = list(prompt.prompt_ids), []
    cache = model.make_cache()
    logits = model(mx.array([ids]), cache, images=[RowImages(0, prompt.images)], last_only=True)
    for step in range(GENERATION.max_tokens):
        tokens.append(int(mx.argmax(logits[0, -1]).item()))
        offset = len(ids) + step
        logits = model(mx.array([tokens[-1:]]), cache, images=[RowImages(offset, prompt.images)])
    return tokens


def run_engine(model, groups: list[list[EngineRequest]]) -> list[list[EngineOutput]]:
    """Submit each group after the one before it finished, on one engine; each request's
    outputs, in submission order."""
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_chunk=8),
        context_size=64,
        block_size=4,
        num_kv_blocks=64,
    )
    engine = Engine(model, config)
    results = []
    try:
        for requests in groups:
            sink = OutputQueue()
            engine.submit(requests, sink)
            outputs, finished = [], 0
            while finished < len(requests):
                outputs.append(sink.get(timeout=TIMEOUT))
                finished += outputs[-1].finished
            results += [[o for o in outputs if o.index == r.index] for r in requests]
    finally:
        engine.shutdown(timeout=TIMEOUT)
    return results


def tokens_of(outputs: list[EngineOutput]) -> list[int]:
    assert not [o.error for o in outputs if o.error is not None]
    return [o.token_id for o in outputs if o.token_id is not None]


def request(prompt: ImagePrompt, index: int) -> EngineRequest:
    return EngineRequest(
        prompt_ids=prompt.prompt_ids,
        sampling=GREEDY,
        generation=GENERATION,
        detokenizer=NullDetokenizer(),
        index=index,
        images=prompt.images,
    )


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
        [[request(image_prompt, 0), request(text_prompt, 1)], [request(image_prompt, 2)]],
    )
    assert tokens_of(first) == greedy_alone(model, image_prompt)
    assert tokens_of(text) == greedy_alone(model, text_prompt)
    assert tokens_of(again) == tokens_of(first)
    assert again[-1].stats.cached_tokens > image_prompt.images[0].stop
    assert encoder.calls == 1
