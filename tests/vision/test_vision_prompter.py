"""The generic image prompter over LLaVA's processor: marker expansion, placeholder runs,
content hashes."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from llava_factory import IMAGE_TOKEN, TinyLlava, image_token_id
from PIL import Image

from mlxcel_models.compute import ComputeOptions
from mlxcel_vision.loading import load_vision_model

TOKENS_PER_IMAGE = (TinyLlava().image_size // TinyLlava().patch_size) ** 2


@pytest.fixture(scope="module")
def prompter(tiny_llava):
    return load_vision_model(tiny_llava, compute=ComputeOptions(float_dtype=mx.float32))


def solid(color: tuple[int, int, int], size: tuple[int, int] = (64, 64)) -> Image.Image:
    return Image.new("RGB", size, color)


def test_each_marker_becomes_one_run_of_image_tokens(prompter):
    text = f"<|im_start|>user\n{IMAGE_TOKEN}compare{IMAGE_TOKEN}{IMAGE_TOKEN}<|im_end|>\n"
    images = [solid((255, 0, 0)), solid((0, 255, 0)), solid((0, 0, 255))]
    prompt = prompter.image_prompter.encode(text, images)
    ids = prompt.prompt_ids
    assert [image.num_tokens for image in prompt.images] == [TOKENS_PER_IMAGE] * 3
    assert ids.count(image_token_id()) == 3 * TOKENS_PER_IMAGE
    for image in prompt.images:
        assert set(ids[image.start : image.stop]) == {image_token_id()}
    # The second and third images touch: one long run of tokens, split by the images' sizes.
    assert prompt.images[2].start == prompt.images[1].stop
    assert prompter.tokenizer.decode(ids[prompt.images[0].stop : prompt.images[1].start]) == (
        "compare"
    )
    pixels = prompt.images[0].inputs
    assert pixels.shape == (TinyLlava().image_size, TinyLlava().image_size, 3)
    assert pixels.dtype == np.float32


@pytest.mark.parametrize(("markers", "images"), [(2, 1), (1, 2), (0, 1), (1, 0)])
def test_markers_and_images_must_pair(prompter, markers, images):
    text = "look " + IMAGE_TOKEN * markers
    with pytest.raises(ValueError, match=f"{markers} image marker.*{images} image"):
        prompter.image_prompter.encode(text, [solid((9, 9, 9))] * images)


def test_same_pixels_same_hash_different_pixels_different_hash(prompter):
    encode = prompter.image_prompter.encode
    red = encode(IMAGE_TOKEN, [solid((255, 0, 0))]).images[0].content_hash
    assert encode(IMAGE_TOKEN, [solid((255, 0, 0))]).images[0].content_hash == red
    assert encode(IMAGE_TOKEN, [solid((254, 0, 0))]).images[0].content_hash != red
    # Same pixel values, another shape: another image.
    assert encode(IMAGE_TOKEN, [solid((255, 0, 0), (32, 128))]).images[0].content_hash != red


def test_a_text_without_images_is_plain_tokens(prompter):
    prompt = prompter.image_prompter.encode("<|im_start|>user\nhello<|im_end|>\n", [])
    assert prompt.images == ()
    assert list(prompt.prompt_ids) == prompter.tokenizer.encode(
        "<|im_start|>user\nhello<|im_end|>\n", add_special_tokens=False
    )
