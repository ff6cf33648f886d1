"""A SmolVLM folder through `load_vision_model`: chat template, prompter and the
vision-language model in chunked prefill, against transformers."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from idefics3_factory import write_idefics3_model
from PIL import Image

from mlxcel_core.images import RowImages
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.metadata import ModelKind
from mlxcel_vision.loading import load_vision_model

torch = pytest.importorskip("torch")

MESSAGES = [
    {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}],
    }
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_idefics3_model(tmp_path_factory.mktemp("e2e") / "smolvlm", model_type="smolvlm")


def test_chat_with_an_image_matches_transformers(folder):
    from transformers import Idefics3Processor, SmolVLMForConditionalGeneration

    loaded = load_vision_model(folder, compute=ComputeOptions(float_dtype=mx.float32))
    image = Image.fromarray(
        np.random.default_rng(4).integers(0, 256, (56, 40, 3), dtype=np.uint8), "RGB"
    )
    text = loaded.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    prompt = loaded.image_prompter.encode(text, [image])
    # transformers' SmolVLMProcessor needs num2words and a video processor; Idefics3Processor
    # writes the same text.
    reference_inputs = Idefics3Processor.from_pretrained(folder)(
        text=text, images=[image], return_tensors="pt"
    )
    model = SmolVLMForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(**reference_inputs).logits[0].numpy()

    cache = loaded.model.make_cache()
    ids = prompt.prompt_ids
    split = prompt.images[1].start + 4  # inside the second tile's run
    logits = [
        loaded.model(mx.array([ids[start:stop]]), cache, images=[RowImages(start, prompt.images)])
        for start, stop in ((0, split), (split, len(ids)))
    ]

    assert loaded.family.kind is ModelKind.VLM
    assert loaded.model.supports_images
    assert list(ids) == reference_inputs["input_ids"][0].tolist()
    assert len(prompt.images) == 5  # 2 x 2 tiles and the global image
    np.testing.assert_allclose(
        np.array(mx.concatenate(logits, axis=1)[0]), expected, atol=1e-3, rtol=0
    )
