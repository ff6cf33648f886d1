"""Qwen2-VL and Qwen2.5-VL through the generic loader, prompter and `VisionLanguageModel`:
a chat about an image, prefilled in chunks and decoded greedily, against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from qwen2_vl_factories import IMAGE_MARKER, SPECIAL_TOKENS, write_qwen2_5_vl, write_qwen2_vl  # noqa: E402
from transformers import AutoModelForImageTextToText  # noqa: E402

from mlxcel_core.cache import DenseKVCache  # noqa: E402
from mlxcel_core.images import RowImages  # noqa: E402
from mlxcel_models.compute import ComputeOptions  # noqa: E402
from mlxcel_models.metadata import ModelKind  # noqa: E402
from mlxcel_vision.loading import load_vision_model  # noqa: E402

TOLERANCE = 1e-3
CHUNK = 8
NUM_DECODED = 4


@pytest.mark.parametrize(
    "write", [write_qwen2_vl, write_qwen2_5_vl], ids=["qwen2_vl", "qwen2_5_vl"]
)
def test_a_chat_about_an_image_matches_transformers_greedy_decoding(tmp_path: Path, write):
    folder = write(tmp_path / "model")
    loaded = load_vision_model(folder, compute=ComputeOptions(float_dtype=mx.float32))
    assert loaded.family.kind is ModelKind.VLM
    assert loaded.image_prompter.image_marker == IMAGE_MARKER
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}
    ]
    text = loaded.tokenizer.apply_chat_template(messages)
    pixels = np.random.default_rng(1).integers(0, 256, (90, 60, 3), dtype=np.uint8)
    prompt = loaded.image_prompter.encode(text, [Image.fromarray(pixels)])
    (image,) = prompt.images
    ids = list(prompt.prompt_ids)
    assert ids[image.start - 1] == SPECIAL_TOKENS.index("<|vision_start|>")
    assert image.num_tokens == 6

    model = loaded.model
    cache = [DenseKVCache() for _ in range(model.num_layers)]
    for start in range(0, len(ids), CHUNK):
        chunk = mx.array([ids[start : start + CHUNK]])
        logits = model(chunk, cache, last_only=True, images=[RowImages(start, prompt.images)])
    steps = []
    generated = []
    for _ in range(NUM_DECODED):
        steps.append(np.array(logits[0, -1]))
        generated.append(int(np.argmax(steps[-1])))
        logits = model(
            mx.array([generated[-1:]]),
            cache,
            last_only=True,
            images=[RowImages(cache[0].offset, prompt.images)],
        )

    reference = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    input_ids = torch.tensor([ids + generated[:-1]])
    with torch.no_grad():
        expected = (
            reference(
                input_ids=input_ids,
                mm_token_type_ids=(input_ids == SPECIAL_TOKENS.index("<|image_pad|>")).int(),
                pixel_values=torch.tensor(image.inputs.pixel_values),
                image_grid_thw=torch.tensor([image.inputs.grid_thw]),
            )
            .logits[0, len(ids) - 1 :]
            .numpy()
        )
    np.testing.assert_allclose(np.stack(steps), expected, atol=TOLERANCE)
    assert generated == [int(token) for token in expected.argmax(axis=-1)]
