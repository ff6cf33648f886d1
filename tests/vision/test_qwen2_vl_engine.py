"""Qwen2-VL through the continuous-batching engine: chunked prefill splitting the image,
batching with a text request over paged KV, and a second request about the same image served
from the prefix cache all give the tokens of a plain greedy loop (multimodal RoPE included)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the tiny folder is written by transformers' own classes

import mlx.core as mx
import numpy as np
from engine_runs import greedy_alone, greedy_request, run_engine, tokens_of
from PIL import Image
from qwen2_vl_factories import write_qwen2_vl

from mlxcel_core.engine import EngineConfig, SchedulerConfig
from mlxcel_core.request import GenerationConfig
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.image_prompt import ImagePrompt
from mlxcel_models.loaded import LoadedModel
from mlxcel_vision.loading import load_vision_model

GENERATION = GenerationConfig(context_size=128, max_tokens=6)
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder = write_qwen2_vl(tmp_path_factory.mktemp("qwen2-vl") / "model")
    return load_vision_model(folder, compute=ComputeOptions(float_dtype=mx.float32))


def _image_prompt(loaded: LoadedModel) -> ImagePrompt:
    content = [{"type": "image"}, {"type": "text", "text": "What is it?"}]
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": content}])
    pixels = np.random.default_rng(3).integers(0, 256, (90, 60, 3), dtype=np.uint8)
    return loaded.image_prompter.encode(text, [Image.fromarray(pixels)])


def _text_prompt(loaded: LoadedModel) -> ImagePrompt:
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "Hello there!"}])
    return ImagePrompt(tuple(loaded.tokenizer.encode(text, add_special_tokens=False)), ())


def _engine_config(*, prefill_chunk: int, prefix_caching: bool = True) -> EngineConfig:
    return EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_chunk=prefill_chunk),
        context_size=GENERATION.context_size,
        block_size=BLOCK_SIZE,
        num_kv_blocks=128,
        enable_prefix_caching=prefix_caching,
    )


def test_chunked_and_batched_runs_give_the_greedy_loops_tokens(loaded: LoadedModel):
    image_prompt, text_prompt = _image_prompt(loaded), _text_prompt(loaded)
    expected = [
        greedy_alone(loaded.model, prompt, GENERATION.max_tokens)
        for prompt in (image_prompt, text_prompt)
    ]
    (image,) = image_prompt.images
    # Chunks of 8 tokens: the image's 6 placeholders straddle a chunk boundary.
    assert image.start // 8 != (image.stop - 1) // 8
    outputs = run_engine(
        loaded.model,
        _engine_config(prefill_chunk=8, prefix_caching=False),
        [[greedy_request(image_prompt, 0, GENERATION), greedy_request(text_prompt, 1, GENERATION)]],
    )
    assert [tokens_of(o) for o in outputs] == expected


def test_a_second_request_about_the_same_image_reuses_its_kv(loaded: LoadedModel):
    image_prompt = _image_prompt(loaded)
    expected = greedy_alone(loaded.model, image_prompt, GENERATION.max_tokens)
    first, second = run_engine(
        loaded.model,
        _engine_config(prefill_chunk=64),
        [
            [greedy_request(image_prompt, 0, GENERATION)],
            [greedy_request(image_prompt, 0, GENERATION)],
        ],
    )
    assert tokens_of(first) == tokens_of(second) == expected
    assert first[-1].stats.cached_tokens == 0
    # Every full block before the prompt's last token is reused, the image's included.
    num_prompt = len(image_prompt.prompt_ids)
    assert second[-1].stats.cached_tokens == (num_prompt - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert second[-1].stats.cached_tokens >= image_prompt.images[0].stop
