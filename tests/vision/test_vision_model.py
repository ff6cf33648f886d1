"""`VisionLanguageModel`: the encoder runs only where image positions are, once per image
while its output stays cached."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest
from llava_factory import IMAGE_TOKEN
from mlx_lm.models import base, llama
from PIL import Image

from mlxcel_core.cache import DenseKVCache
from mlxcel_core.images import ImageLanguageModel, RowImages
from mlxcel_models.compute import ComputeOptions
from mlxcel_vision.loading import load_vision_model
from mlxcel_vision.model import VisionLanguageModel


class CountingEncoder:
    """Wraps an encoder, counting its calls."""

    def __init__(self, encoder):
        self.encoder = encoder
        self.calls = 0

    def __call__(self, inputs):
        self.calls += 1
        return self.encoder(inputs)


@pytest.fixture(scope="module")
def loaded(tiny_llava):
    return load_vision_model(tiny_llava, compute=ComputeOptions(float_dtype=mx.float32))


def counting_model(loaded, **options) -> tuple[VisionLanguageModel, CountingEncoder]:
    parts = loaded.model.parts
    encoder = CountingEncoder(parts.encoder)
    return VisionLanguageModel(dataclasses.replace(parts, encoder=encoder), **options), encoder


def image_prompt(loaded, color):
    return loaded.image_prompter.encode(
        f"<|im_start|>user\n{IMAGE_TOKEN}hi<|im_end|>\n", [Image.new("RGB", (48, 48), color)]
    )


def prefill(model, prompt, chunk: int) -> mx.array:
    """Prefill `prompt` in passes of `chunk` tokens; the last pass's logits."""
    ids = prompt.prompt_ids
    cache = model.make_cache()
    for offset in range(0, len(ids), chunk):
        logits = model(
            mx.array([ids[offset : offset + chunk]]),
            cache,
            images=[RowImages(offset, prompt.images)],
        )
    mx.eval(logits)
    return logits


def test_is_an_image_language_model(loaded):
    assert isinstance(loaded.model, ImageLanguageModel)
    assert loaded.model.supports_images


def test_the_encoder_runs_once_for_passes_over_the_same_image(loaded):
    model, encoder = counting_model(loaded)
    prompt = image_prompt(loaded, (255, 0, 0))
    (image,) = prompt.images
    chunked = prefill(model, prompt, chunk=image.start + 3)
    assert encoder.calls == 1
    # A second request about the same image reuses the encoder's output.
    again = prefill(model, prompt, chunk=len(prompt.prompt_ids))
    assert encoder.calls == 1
    np.testing.assert_allclose(np.array(chunked[:, -1]), np.array(again[:, -1]), atol=1e-5, rtol=0)


def test_passes_without_image_positions_skip_the_encoder(loaded):
    model, encoder = counting_model(loaded)
    prompt = image_prompt(loaded, (0, 255, 0))
    (image,) = prompt.images
    cache = model.make_cache()
    model(mx.array([prompt.prompt_ids[: image.start]]), cache, images=[RowImages(0, prompt.images)])
    assert encoder.calls == 0
    model(
        mx.array([prompt.prompt_ids[image.start :]]),
        cache,
        images=[RowImages(image.start, prompt.images)],
    )
    decode = mx.array([[prompt.prompt_ids[-1]]])
    model(decode, cache, images=[RowImages(len(prompt.prompt_ids), prompt.images)])
    model(decode, cache)
    assert encoder.calls == 1


def test_the_oldest_encoder_output_is_dropped_past_the_limit(loaded):
    model, encoder = counting_model(loaded, max_cached_images=1)
    red, blue = image_prompt(loaded, (255, 0, 0)), image_prompt(loaded, (0, 0, 255))
    for prompt in (red, blue, red):
        prefill(model, prompt, chunk=len(prompt.prompt_ids))
    assert encoder.calls == 3


def test_the_image_changes_the_logits_and_rows_are_checked(loaded):
    red, blue = image_prompt(loaded, (255, 0, 0)), image_prompt(loaded, (0, 0, 255))
    model = loaded.model
    assert not np.allclose(np.array(prefill(model, red, 64)), np.array(prefill(model, blue, 64)))
    with pytest.raises(ValueError, match="one RowImages per row: 1 rows, 2 given"):
        model(
            mx.array([red.prompt_ids]),
            model.make_cache(),
            images=[RowImages(0, red.images), RowImages(0, ())],
        )


class RecordingCache(DenseKVCache):
    """A dense cache that computes attention (as zeros), counting its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def attention(self, queries, keys, values, *, scale, mask):
        self.calls += 1
        return mx.zeros_like(queries)


def test_the_text_decoder_attends_through_caches_that_compute_attention(tiny_llava, monkeypatch):
    # Undo the routing an earlier load in this process may have made, so this load must.
    monkeypatch.setattr(llama, "scaled_dot_product_attention", base.scaled_dot_product_attention)
    model = load_vision_model(tiny_llava, compute=ComputeOptions(float_dtype=mx.float32)).model
    caches = [RecordingCache() for _ in range(model.num_layers)]
    model(mx.array([[1, 2, 3]]), caches)
    assert [cache.calls for cache in caches] == [1] * model.num_layers
