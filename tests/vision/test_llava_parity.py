"""mlxcel's LLaVA against transformers' PyTorch implementation on the same random weights."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from llava_factory import LAYOUTS, TinyLlava, make_torch_llava, write_llava_model
from PIL import Image

from mlxcel_core.images import RowImages
from mlxcel_models.compute import ComputeOptions
from mlxcel_vision.loading import load_vision_model

torch = pytest.importorskip("torch")

FLOAT32 = ComputeOptions(float_dtype=mx.float32)
TOLERANCE = 1e-3
# LLaVA-NeXT grid resolutions for the factory's 56-pixel tower: 1x2, 2x1 and 2x2 tiles.
ANYRES = ((56, 112), (112, 56), (112, 112))


def photo(seed: int, size: tuple[int, int] = (70, 40)) -> Image.Image:
    """A random RGB picture, not square, so resizing and cropping both act."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    return Image.fromarray(pixels)


def chat_with_image(loaded, text: str = "what is this?", num_images: int = 1) -> str:
    parts = [{"type": "image"}] * num_images + [{"type": "text", "text": text}]
    return loaded.tokenizer.apply_chat_template([{"role": "user", "content": parts}])


def reference_logits(config: TinyLlava, folder, prompt_ids, images) -> np.ndarray:
    from transformers import AutoImageProcessor

    model = make_torch_llava(config)
    inputs = AutoImageProcessor.from_pretrained(folder, backend="pil")(
        images=images, return_tensors="pt"
    )
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt_ids]), **inputs).logits.numpy()


@pytest.mark.parametrize(
    ("config", "layout"),
    [
        *((TinyLlava(), layout) for layout in LAYOUTS),
        (TinyLlava(feature_layer=[-1, 0], select_strategy="full", seed=1), "saved"),
        (TinyLlava(text_model_type="mistral", seed=2), "saved"),
        (TinyLlava(text_model_type="qwen2", seed=3), "saved"),
        *((TinyLlava(grid_pinpoints=ANYRES, seed=4), layout) for layout in LAYOUTS),
    ],
    ids=[*LAYOUTS, "full-two-layers", "mistral", "qwen2", *(f"next-{name}" for name in LAYOUTS)],
)
def test_logits_match_transformers(tmp_path, config, layout):
    folder = write_llava_model(tmp_path / "llava", config, layout)
    loaded = load_vision_model(folder, compute=FLOAT32)
    # A wide and a tall picture: LLaVA-NeXT tiles them differently and unpads rows of one,
    # columns of the other.
    images = [photo(0, (70, 40)), photo(1, (40, 90))]
    prompt = loaded.image_prompter.encode(chat_with_image(loaded, num_images=2), images)
    cache = loaded.model.make_cache()
    logits = loaded.model(
        mx.array([prompt.prompt_ids]), cache, images=[RowImages(0, prompt.images)]
    )
    expected = reference_logits(config, folder, prompt.prompt_ids, images)
    assert logits.shape == expected.shape
    np.testing.assert_allclose(np.array(logits), expected, atol=TOLERANCE, rtol=0)


def test_chunked_prefill_and_decode_match_one_pass(tiny_llava):
    loaded = load_vision_model(tiny_llava, compute=FLOAT32)
    prompt = loaded.image_prompter.encode(chat_with_image(loaded), [photo(1)])
    ids = list(prompt.prompt_ids)
    (image,) = prompt.images
    whole = loaded.model(
        mx.array([ids]), loaded.model.make_cache(), images=[RowImages(0, prompt.images)]
    )
    cache = loaded.model.make_cache()
    split = image.start + image.num_tokens // 2
    chunks = []
    for offset, stop in ((0, split), (split, len(ids) - 1), (len(ids) - 1, len(ids))):
        chunks.append(
            loaded.model(
                mx.array([ids[offset:stop]]), cache, images=[RowImages(offset, prompt.images)]
            )
        )
    np.testing.assert_allclose(
        np.array(mx.concatenate(chunks, axis=1)), np.array(whole), atol=1e-5, rtol=0
    )
