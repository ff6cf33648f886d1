"""Qwen2-VL and Qwen2.5-VL on MLX against transformers' PyTorch implementation: tiny
random-weight folders of the real architectures, float32, within 1e-3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from PIL import Image  # noqa: E402
from qwen2_vl_factories import SPECIAL_TOKENS, write_qwen2_5_vl, write_qwen2_vl  # noqa: E402
from transformers import AutoModelForImageTextToText  # noqa: E402

from mlxcel_core.cache import DenseKVCache  # noqa: E402
from mlxcel_core.cache.paged import (  # noqa: E402
    BatchRow,
    LayerGeometry,
    PagedBatch,
    PagedKVStorage,
    make_layer_caches,
)
from mlxcel_core.images import PromptImage, RowImages  # noqa: E402
from mlxcel_models.compute import ComputeOptions  # noqa: E402
from mlxcel_models.errors import ModelLoadError  # noqa: E402
from mlxcel_vision.families.qwen2_vl import load_parts  # noqa: E402
from mlxcel_vision.family import VisionParts  # noqa: E402

TOLERANCE = 1e-3
IMAGE_PAD = SPECIAL_TOKENS.index("<|image_pad|>")
VISION_START = SPECIAL_TOKENS.index("<|vision_start|>")
VISION_END = SPECIAL_TOKENS.index("<|vision_end|>")
TEXT = [10, 11, 12, 13, 14, 15, 16]
DECODED = [40, 41, 42, 43]


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    write = write_qwen2_vl if request.param == "qwen2_vl" else write_qwen2_5_vl
    return write(tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def reference(folder: Path):
    return AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()


def _load(folder: Path) -> VisionParts:
    config = json.loads((folder / "config.json").read_text())
    return load_parts(folder, config, ComputeOptions(float_dtype=mx.float32))


@pytest.fixture(scope="module")
def parts(folder: Path) -> VisionParts:
    return _load(folder)


def _image(height: int, width: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _two_image_prompt(parts: VisionParts) -> tuple[list[int], tuple[PromptImage, ...]]:
    """Text, a 3 x 2-token image, text, a 1 x 2-token image, text."""
    ids: list[int] = []
    images = []
    for number, (height, width) in enumerate([(90, 60), (28, 56)]):
        (run,) = parts.processor.prepare(_image(height, width, number)).runs
        ids += [*TEXT[number * 3 : number * 3 + 3], VISION_START]
        images.append(PromptImage(len(ids), run.num_tokens, f"image-{number}", run.inputs))
        ids += [IMAGE_PAD] * run.num_tokens + [VISION_END]
    return ids + TEXT[-2:], tuple(images)


def _reference_logits(reference, ids: list[int], images: tuple[PromptImage, ...]) -> np.ndarray:
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        output = reference(
            input_ids=input_ids,
            mm_token_type_ids=(input_ids == IMAGE_PAD).int(),
            pixel_values=torch.tensor(
                np.concatenate([image.inputs.pixel_values for image in images])
            ),
            image_grid_thw=torch.tensor([image.inputs.grid_thw for image in images]),
        )
    return output.logits[0].numpy()


def _embed_with_images(parts: VisionParts, ids: list[int], images) -> mx.array:
    embeddings = parts.decoder.embed(mx.array([ids]))
    for image in images:
        embeddings[0, image.start : image.stop] = parts.encoder(image.inputs)
    return embeddings


def test_vision_tower_and_merger_match_transformers(parts: VisionParts, reference):
    (run,) = parts.processor.prepare(_image(90, 60, seed=0)).runs
    with torch.no_grad():
        expected = reference.model.visual(
            torch.tensor(run.inputs.pixel_values), grid_thw=torch.tensor([run.inputs.grid_thw])
        ).pooler_output.numpy()
    features = np.array(parts.encoder(run.inputs))
    assert features.shape == (run.num_tokens, 64)
    np.testing.assert_allclose(features, expected, atol=TOLERANCE)


def test_logits_of_a_chunked_prefill_with_images_and_of_decode_steps_match(
    parts: VisionParts, reference
):
    ids, images = _two_image_prompt(parts)
    expected = _reference_logits(reference, ids + DECODED, images)
    embeddings = _embed_with_images(parts, ids, images)
    cache = [DenseKVCache() for _ in range(parts.decoder.num_layers)]
    logits = []
    # The first chunk ends inside the first image.
    for start, stop in [(0, images[0].start + 2), (images[0].start + 2, len(ids))]:
        rows = [RowImages(start, images)]
        logits.append(parts.decoder(embeddings[:, start:stop], cache, images=rows))
    for token in DECODED[:-1]:
        rows = [RowImages(cache[0].offset, images)]
        logits.append(parts.decoder(parts.decoder.embed(mx.array([[token]])), cache, images=rows))
    mine = np.array(mx.concatenate(logits, axis=1)[0])
    np.testing.assert_allclose(mine, expected[:-1], atol=TOLERANCE)
    # Last-position logits of a pass are the pass's last row.
    cache = [DenseKVCache() for _ in range(parts.decoder.num_layers)]
    last = parts.decoder(embeddings, cache, images=[RowImages(0, images)], last_only=True)
    np.testing.assert_allclose(np.array(last[0, 0]), expected[len(ids) - 1], atol=TOLERANCE)


def test_rows_without_images_give_the_text_model_logits(parts: VisionParts, reference):
    ids = TEXT + DECODED
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor([ids])).logits[0].numpy()
    embeddings = parts.decoder.embed(mx.array([ids]))
    for rows in (None, [RowImages(0, ())]):
        cache = [DenseKVCache() for _ in range(parts.decoder.num_layers)]
        logits = np.array(parts.decoder(embeddings, cache, images=rows)[0])
        np.testing.assert_allclose(logits, expected, atol=TOLERANCE)


def test_a_paged_batch_of_a_row_with_images_and_a_text_row_matches(parts: VisionParts, reference):
    image_ids, images = _two_image_prompt(parts)
    text_ids = TEXT
    expected_image_row = _reference_logits(reference, [*image_ids, DECODED[0]], images)
    with torch.no_grad():
        expected_text_row = reference(input_ids=torch.tensor([[*text_ids, DECODED[0]]]))
    expected_text_row = expected_text_row.logits[0].numpy()
    block_size = 16
    storage = PagedKVStorage([LayerGeometry(2, 16, 16, mx.float32)] * 2, block_size, 8)
    storage.ensure_capacity(storage.max_blocks[0])
    tables = [[1, 2], [3, 4]]
    lengths = [len(image_ids), len(text_ids)]
    longest = max(lengths)
    embeddings = mx.zeros((2, longest, 64))
    embeddings[0] = _embed_with_images(parts, image_ids, images)[0]
    embeddings[1, : len(text_ids)] = parts.decoder.embed(mx.array([text_ids]))[0]
    batch = PagedBatch([BatchRow(tables[b], 0, lengths[b]) for b in range(2)], block_size)
    rows = [RowImages(0, images), RowImages(0, ())]
    prefill = parts.decoder(embeddings, make_layer_caches(storage, batch), images=rows)
    step = parts.decoder.embed(mx.array([[DECODED[0]], [DECODED[0]]]))
    batch = PagedBatch([BatchRow(tables[b], lengths[b], 1) for b in range(2)], block_size)
    rows = [RowImages(lengths[0], images), RowImages(lengths[1], ())]
    decode = parts.decoder(step, make_layer_caches(storage, batch), images=rows)
    for b, expected in enumerate([expected_image_row, expected_text_row]):
        mine = np.concatenate([np.array(prefill[b, : lengths[b]]), np.array(decode[b])])
        np.testing.assert_allclose(mine, expected, atol=TOLERANCE)


def _rewrite(folder: Path, target: Path, rename, *, config_edit=None) -> Path:
    """Copy `folder` to `target` with its tensors renamed (and reshaped) by `rename`."""
    target.mkdir()
    for file in folder.iterdir():
        if file.suffix != ".safetensors":
            (target / file.name).write_bytes(file.read_bytes())
    weights = mx.load(str(folder / "model.safetensors"))
    mx.save_safetensors(
        str(target / "model.safetensors"), dict(rename(k, v) for k, v in weights.items())
    )
    if config_edit is not None:
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps(config_edit(config)))
    return target


def _transformers5_name(name: str, value: mx.array) -> tuple[str, mx.array]:
    if name.startswith("visual."):
        return "model." + name, value
    if name.startswith("model."):
        return "model.language_model." + name.removeprefix("model."), value
    return name, value


def _mlx_vlm_name(name: str, value: mx.array) -> tuple[str, mx.array]:
    if name == "visual.patch_embed.proj.weight":
        value = value.transpose(0, 2, 3, 4, 1)
    if name.startswith("visual."):
        return "vision_tower." + name.removeprefix("visual."), value
    return "language_model." + name, value


def _flat_config(config: dict) -> dict:
    """config.json as transformers 4 wrote it: text settings at the top level, M-RoPE in
    `rope_scaling`."""
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    return {
        **text,
        **config,
        "rope_theta": rope["rope_theta"],
        "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]},
    }


@pytest.mark.parametrize(
    ("rename", "config_edit"),
    [(_transformers5_name, None), (_mlx_vlm_name, None), (_transformers5_name, _flat_config)],
    ids=["transformers5", "mlx-vlm", "transformers4-config"],
)
def test_other_layouts_load_to_the_same_model(
    folder: Path, parts: VisionParts, tmp_path: Path, rename, config_edit
):
    other = _load(_rewrite(folder, tmp_path / "other", rename, config_edit=config_edit))
    ids, images = _two_image_prompt(parts)
    results = []
    for model in (parts, other):
        cache = [DenseKVCache() for _ in range(model.decoder.num_layers)]
        embeddings = _embed_with_images(model, ids, images)
        results.append(np.array(model.decoder(embeddings, cache, images=[RowImages(0, images)])))
    np.testing.assert_array_equal(results[0], results[1])


def test_a_quantized_mlx_vlm_folder_loads_its_quantized_layers(folder: Path, tmp_path: Path):
    expected_model = _load(folder)
    # As mlx-vlm quantizes: every linear layer whose input splits into groups of 32.
    nn.quantize(
        expected_model.module,
        group_size=32,
        bits=8,
        class_predicate=lambda _, layer: (
            isinstance(layer, (nn.Linear, nn.Embedding)) and layer.weight.shape[-1] % 32 == 0
        ),
    )
    target = _rewrite(folder, tmp_path / "quantized", _mlx_vlm_name)
    stored = {
        name.replace("visual.", "vision_tower.", 1): value
        for name, value in tree_flatten(expected_model.module.parameters())
    }
    mx.save_safetensors(str(target / "model.safetensors"), stored)
    config = json.loads((target / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 8}
    (target / "config.json").write_text(json.dumps(config))
    loaded = _load(target)
    quantized = [
        name
        for name, layer in loaded.module.named_modules()
        if isinstance(layer, nn.QuantizedLinear)
    ]
    assert "language_model.model.layers.0.self_attn.q_proj" in quantized
    assert "visual.blocks.0.attn.qkv" in quantized
    ids, images = _two_image_prompt(loaded)
    results = []
    for model in (expected_model, loaded):
        cache = [DenseKVCache() for _ in range(model.decoder.num_layers)]
        embeddings = _embed_with_images(model, ids, images)
        results.append(np.array(model.decoder(embeddings, cache, images=[RowImages(0, images)])))
    np.testing.assert_array_equal(results[0], results[1])


def test_a_missing_tensor_is_named(folder: Path, tmp_path: Path):
    def drop_merger_bias(name: str, value: mx.array) -> tuple[str, mx.array]:
        return ("unused." + name if name == "visual.merger.mlp.2.bias" else name), value

    with pytest.raises(ModelLoadError, match=r"lack visual\.merger\.mlp\.2\.bias"):
        _load(_rewrite(folder, tmp_path / "broken", drop_merger_bias))
