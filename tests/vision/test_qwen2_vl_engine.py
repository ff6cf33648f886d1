"""Qwen2-VL through the continuous-batching engine: chunked prefill splitting the image,
batching with a text request over paged KV, and a second request about the same image served
from the prefix cache all give the tokens of a plain greedy loop (multimodal RoPE included)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

pytest.importorskip("torch")  # the tiny folder is written by transformers' own classes

import mlx.core as mx
import numpy as np
from PIL import Image
from qwen2_vl_factories import write_qwen2_vl

from mlxcel_core.cache import DenseKVCache
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
from mlxcel_models.loaded import LoadedModel
from mlxcel_vision.loading import load_vision_model

MAX_TOKENS = 6
TIMEOUT = 120.0
GENERATION = GenerationConfig(context_size=128, max_tokens=MAX_TOKENS)
BLOCK_SIZE = 4


class NullDetokenizer:
    def add_token(self, token_id: int) -> str:
        return ""

    def finalize(self) -> str:
        return ""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder = write_qwen2_vl(tmp_path_factory.mktemp("qwen2-vl") / "model")
    return load_vision_model(folder, compute=ComputeOptions(float_dtype=mx.float32))


def _image_prompt(loaded: LoadedModel) -> ImagePrompt:
    content = [{"type": "image"}, {"type": "text", "text": "What is it?"}]
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": content}])
    pixels = np.random.default_rng(3).integers(0, 256, (90, 60, 3), dtype=np.uint8)
    return loaded.image_prompter.encode(text, [Image.fromarray(pixels)])


def _text_prompt(loaded: LoadedModel) -> tuple[int, ...]:
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "Hello there!"}])
    return tuple(loaded.tokenizer.encode(text, add_special_tokens=False))


def _greedy_loop(loaded: LoadedModel, prompt: ImagePrompt) -> list[int]:
    """Greedy tokens from the whole prompt in one pass, then one token per pass."""
    model = loaded.model
    cache = [DenseKVCache() for _ in range(model.num_layers)]
    tokens = list(prompt.prompt_ids)
    generated: list[int] = []
    while len(generated) < MAX_TOKENS:
        start = cache[0].offset
        logits = model(
            mx.array([tokens[start:]]),
            cache,
            last_only=True,
            images=[RowImages(start, prompt.images)] if prompt.images else None,
        )
        generated.append(int(mx.argmax(logits[0, -1]).item()))
        tokens.append(generated[-1])
    return generated


def _request(prompt: ImagePrompt, index: int = 0) -> EngineRequest:
    return EngineRequest(
        prompt_ids=prompt.prompt_ids,
        sampling=SamplingParams(temperature=0.0),
        generation=GENERATION,
        detokenizer=NullDetokenizer(),
        index=index,
        images=prompt.images,
    )


def _engine_config(*, prefill_chunk: int, prefix_caching: bool = True) -> EngineConfig:
    return EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_chunk=prefill_chunk),
        context_size=GENERATION.context_size,
        block_size=BLOCK_SIZE,
        num_kv_blocks=128,
        enable_prefix_caching=prefix_caching,
    )


def _generate(engine: Engine, requests: Sequence[EngineRequest]) -> list[list[EngineOutput]]:
    sink = OutputQueue()
    engine.submit(requests, sink)
    outputs, finished = [], 0
    while finished < len(requests):
        output = sink.get(timeout=TIMEOUT)
        outputs.append(output)
        finished += output.finished
    return [[o for o in outputs if o.index == i] for i in range(len(requests))]


def _tokens(outputs: Sequence[EngineOutput]) -> list[int]:
    return [o.token_id for o in outputs if o.token_id is not None]


def test_chunked_and_batched_runs_give_the_greedy_loops_tokens(loaded: LoadedModel):
    image_prompt = _image_prompt(loaded)
    text_prompt = ImagePrompt(_text_prompt(loaded), ())
    expected = [_greedy_loop(loaded, image_prompt), _greedy_loop(loaded, text_prompt)]
    (image,) = image_prompt.images
    # Chunks of 8 tokens: the image's 6 placeholders straddle a chunk boundary.
    assert image.start // 8 != (image.stop - 1) // 8
    engine = Engine(loaded.model, _engine_config(prefill_chunk=8, prefix_caching=False))
    try:
        outputs = _generate(engine, [_request(image_prompt, 0), _request(text_prompt, 1)])
    finally:
        engine.shutdown(timeout=TIMEOUT)
    assert [_tokens(o) for o in outputs] == expected


def test_a_second_request_about_the_same_image_reuses_its_kv(loaded: LoadedModel):
    image_prompt = _image_prompt(loaded)
    expected = _greedy_loop(loaded, image_prompt)
    engine = Engine(loaded.model, _engine_config(prefill_chunk=64))
    try:
        (first,) = _generate(engine, [_request(image_prompt)])
        (second,) = _generate(engine, [_request(image_prompt)])
    finally:
        engine.shutdown(timeout=TIMEOUT)
    assert _tokens(first) == _tokens(second) == expected
    assert first[-1].stats.cached_tokens == 0
    # Every full block before the prompt's last token is reused, the image's included.
    num_prompt = len(image_prompt.prompt_ids)
    assert second[-1].stats.cached_tokens == (num_prompt - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert second[-1].stats.cached_tokens >= image_prompt.images[0].stop
