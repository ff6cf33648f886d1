"""Idefics3 on MLX against transformers' PyTorch implementation, on the same random weights.

Two folders: images split into 2x2 tiles plus the global image with a separate LM head, and
unsplit images with a tied head. Pixels and prompt ids must be equal; vision features and
logits (float32) within 1e-3.
"""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from idefics3_factory import IMAGE_SEQ_LEN, write_idefics3_model
from PIL import Image

from mlxcel_core.cache import DenseKVCache
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_vision.families.idefics3 import load_parts

torch = pytest.importorskip("torch")

TOLERANCE = 1e-3
PROMPT = "<|im_start|>User:<image>What is in this picture?<end_of_utterance>\nAssistant:"


@pytest.fixture(scope="module", params=["split", "unsplit-tied"])
def folder(request, tmp_path_factory):
    split = request.param == "split"
    return write_idefics3_model(
        tmp_path_factory.mktemp(request.param) / "idefics3",
        do_image_splitting=split,
        tie_word_embeddings=not split,
    )


@pytest.fixture(scope="module")
def parts(folder):
    config = json.loads((folder / "config.json").read_text())
    return load_parts(folder, config, ComputeOptions(float_dtype=mx.float32))


@pytest.fixture(scope="module")
def reference(folder):
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    model = Idefics3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), AutoProcessor.from_pretrained(folder)


def random_image(height: int, width: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8)
    return Image.fromarray(pixels, "RGBA").convert(mode)


def placeholder_runs(ids: list[int], placeholder: int) -> list[tuple[int, int]]:
    """(start, stop) of each maximal run of `placeholder` in `ids`."""
    runs: list[tuple[int, int]] = []
    for position, token in enumerate(ids):
        if token != placeholder:
            continue
        if runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs


def mlx_logits(parts, ids: list[int], features: list[mx.array], chunk_stops: list[int]):
    """Prefill `ids` in chunks ending at `chunk_stops`, writing each run's features over
    its placeholders where a chunk overlaps it, as the vision-language wrapper does."""
    cache = [DenseKVCache() for _ in range(parts.decoder.num_layers)]
    runs = placeholder_runs(ids, parts.processor.placeholder_token_id)
    assert len(runs) == len(features)
    logits, start = [], 0
    for stop in chunk_stops:
        embeddings = parts.decoder.embed(mx.array([ids[start:stop]]))
        for (run_start, run_stop), run_features in zip(runs, features, strict=True):
            low, high = max(start, run_start), min(stop, run_stop)
            if low < high:
                embeddings[0, low - start : high - start] = run_features[
                    low - run_start : high - run_start
                ]
        logits.append(parts.decoder(embeddings, cache))
        start = stop
    return mx.concatenate(logits, axis=1), cache


@pytest.mark.parametrize(
    ("height", "width", "mode"), [(64, 64, "RGB"), (50, 70, "RGB"), (90, 40, "RGBA"), (20, 30, "L")]
)
def test_pixels_and_prompt_ids_equal_transformers(parts, reference, folder, height, width, mode):
    _, processor = reference
    image = random_image(height, width, mode)
    expected = processor(text=PROMPT, images=[image], return_tensors="np")

    prepared = parts.processor.prepare(image)
    ids = Tokenizer.from_folder(folder).encode(
        PROMPT.replace("<image>", prepared.text), add_special_tokens=True
    )

    pixels = np.stack([np.array(run.inputs) for run in prepared.runs]).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(pixels, expected["pixel_values"][0])
    assert ids == expected["input_ids"][0].tolist()
    runs = placeholder_runs(ids, parts.processor.placeholder_token_id)
    assert [stop - start for start, stop in runs] == [run.num_tokens for run in prepared.runs]
    assert all(run.num_tokens == IMAGE_SEQ_LEN for run in prepared.runs)


def test_image_text_is_transformers_expansion(parts, reference):
    _, processor = reference
    image = random_image(64, 64)
    prepared = parts.processor.prepare(image)
    expected_text = processor.replace_image_token(
        processor.image_processor(image, return_row_col_info=True), 0
    )
    assert prepared.text == expected_text


def test_vision_features_match_transformers(parts, reference):
    model, processor = reference
    image = random_image(50, 70, seed=1)
    pixel_values = torch.from_numpy(processor.image_processor(image)["pixel_values"])
    with torch.no_grad():
        expected = model.model.get_image_features(pixel_values=pixel_values).pooler_output[0]

    runs = parts.processor.prepare(image).runs
    features = mx.concatenate([parts.encoder(run.inputs) for run in runs])

    assert features.shape == tuple(expected.shape)
    np.testing.assert_allclose(np.array(features), expected.numpy(), atol=TOLERANCE, rtol=0)


def test_logits_match_transformers_in_chunks_and_decode(parts, reference):
    model, processor = reference
    image = random_image(64, 48, seed=2)
    inputs = processor(text=PROMPT, images=[image], return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    with torch.no_grad():
        expected = model(**inputs).logits[0].numpy()
    features = [parts.encoder(run.inputs) for run in parts.processor.prepare(image).runs]

    # Chunks end inside the first and the last placeholder runs.
    runs = placeholder_runs(ids, parts.processor.placeholder_token_id)
    chunk_stops = [runs[0][0] + 5, runs[-1][1] - 3, len(ids)]
    logits, cache = mlx_logits(parts, ids, features, chunk_stops)

    np.testing.assert_allclose(np.array(logits[0]), expected, atol=TOLERANCE, rtol=0)

    next_token = int(expected[-1].argmax())
    with torch.no_grad():
        expected_next = (
            model(
                input_ids=torch.tensor([[*ids, next_token]]),
                pixel_values=inputs["pixel_values"],
            )
            .logits[0, -1]
            .numpy()
        )
    step = parts.decoder(parts.decoder.embed(mx.array([[next_token]])), cache, last_only=True)
    np.testing.assert_allclose(np.array(step[0, -1]), expected_next, atol=TOLERANCE, rtol=0)


def test_smolvlm_logits_match_transformers(tmp_path):
    from transformers import SmolVLMForConditionalGeneration

    folder = write_idefics3_model(tmp_path / "smolvlm", model_type="smolvlm")
    config = json.loads((folder / "config.json").read_text())
    parts = load_parts(folder, config, ComputeOptions(float_dtype=mx.float32))
    model = SmolVLMForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    prepared = parts.processor.prepare(random_image(48, 64, seed=3))
    ids = Tokenizer.from_folder(folder).encode(PROMPT.replace("<image>", prepared.text))
    pixels = np.stack([np.array(run.inputs) for run in prepared.runs]).transpose(0, 3, 1, 2)
    with torch.no_grad():
        expected = model(
            input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(pixels[None])
        ).logits[0]

    features = [parts.encoder(run.inputs) for run in prepared.runs]
    logits, _ = mlx_logits(parts, ids, features, [len(ids)])

    assert config["model_type"] == "smolvlm"
    np.testing.assert_allclose(np.array(logits[0]), expected.numpy(), atol=TOLERANCE, rtol=0)
