"""Qwen2-VL's preprocessing, multimodal RoPE positions and window layout, on CPU in
milliseconds (no torch)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mlxcel_core.images import PromptImage, RowImages
from mlxcel_models.errors import ModelLoadError
from mlxcel_vision.families.qwen2_vl.attention_groups import make_attention_groups
from mlxcel_vision.families.qwen2_vl.config import parse_config
from mlxcel_vision.families.qwen2_vl.image_inputs import Qwen2VLImageInputs
from mlxcel_vision.families.qwen2_vl.positions import batch_positions, row_positions
from mlxcel_vision.families.qwen2_vl.processor import IMAGE_MARKER, Qwen2VLImageProcessor
from mlxcel_vision.families.qwen2_vl.vision_layout import (
    patch_positions,
    window_ids,
    window_order,
)

PREPROCESSOR_CONFIG = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "min_pixels": 28 * 28,
    "max_pixels": 84 * 84,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}


def _image(height: int, width: int) -> Image.Image:
    pixels = np.random.default_rng(height * width).integers(0, 256, (height, width, 3))
    return Image.fromarray(pixels.astype(np.uint8))


def _prompt_image(start: int, grid: tuple[int, int, int]) -> PromptImage:
    t, h, w = grid
    inputs = Qwen2VLImageInputs(np.zeros((t * h * w, 1176), np.float32), grid)
    return PromptImage(start, t * h * w // 4, f"image-at-{start}", inputs)


def test_an_image_becomes_its_wrapper_and_one_pad_per_merged_patch():
    processor = Qwen2VLImageProcessor(PREPROCESSOR_CONFIG, placeholder_token_id=5)
    # 90 x 60 rounds to 84 x 56: a 6 x 4 patch grid, 3 x 2 merged tokens.
    prepared = processor.prepare(_image(90, 60))
    (run,) = prepared.runs
    assert run.inputs.grid_thw == (1, 6, 4)
    assert run.num_tokens == 6
    assert prepared.text == "<|vision_start|>" + "<|image_pad|>" * 6 + "<|vision_end|>"
    assert run.inputs.pixel_values.shape == (24, 3 * 2 * 14 * 14)
    assert processor.image_marker == IMAGE_MARKER


def test_a_large_image_is_scaled_down_within_max_pixels():
    processor = Qwen2VLImageProcessor(PREPROCESSOR_CONFIG, placeholder_token_id=5)
    # 400 x 300 is 17 times max_pixels: scaled by 1 / sqrt(17), floored to 28-pixel steps.
    assert processor.prepare(_image(400, 300)).runs[0].inputs.grid_thw == (1, 6, 4)


def test_older_size_keys_and_an_extreme_aspect_ratio():
    bounds = {"min_pixels": 28 * 28, "max_pixels": 84 * 84}
    legacy = {**PREPROCESSOR_CONFIG, "size": bounds}
    prepared = Qwen2VLImageProcessor(legacy, placeholder_token_id=5).prepare(_image(90, 60))
    assert prepared.runs[0].inputs.grid_thw == (1, 6, 4)
    processor = Qwen2VLImageProcessor(PREPROCESSOR_CONFIG, placeholder_token_id=5)
    with pytest.raises(ValueError, match="aspect ratio"):
        processor.prepare(_image(1, 300))


def test_a_config_without_pixel_bounds_is_refused_at_load():
    settings = {k: v for k, v in PREPROCESSOR_CONFIG.items() if not k.endswith("_pixels")}
    with pytest.raises(ModelLoadError, match="min_pixels and max_pixels"):
        Qwen2VLImageProcessor(
            {**settings, "size": {"height": 56, "width": 56}}, placeholder_token_id=5
        )


def test_positions_follow_the_image_grid_and_continue_after_its_largest_position():
    # 3 text tokens, a 2 x 3 merged grid (6 tokens), 2 text tokens.
    image = _prompt_image(3, (1, 4, 6))
    positions = row_positions(RowImages(0, (image,)), 11, merge_size=2)
    text_before = [[0, 1, 2]] * 3
    grid = [[3] * 6, [3, 3, 3, 4, 4, 4], [3, 4, 5, 3, 4, 5]]
    text_after = [[6, 7]] * 3
    assert positions.tolist() == [
        b + g + a for b, g, a in zip(text_before, grid, text_after, strict=True)
    ]


def test_a_chunk_and_a_decode_step_get_the_positions_of_the_whole_prompt():
    images = (_prompt_image(2, (1, 4, 6)), _prompt_image(10, (1, 2, 4)))
    whole = row_positions(RowImages(0, images), 16, merge_size=2)
    for start, stop in [(0, 5), (5, 11), (11, 16)]:
        chunk = row_positions(RowImages(start, images), stop - start, merge_size=2)
        assert np.array_equal(chunk, whole[:, start:stop])
    # rope_delta: (3 - 6) for the first image, (2 - 2) for the second.
    decode = row_positions(RowImages(16, images), 1, merge_size=2)
    assert decode.tolist() == [[13], [13], [13]]


def test_rows_without_images_have_plain_positions_from_their_offsets():
    positions = batch_positions([RowImages(4, ()), RowImages(0, ())], 3, merge_size=2)
    assert positions.shape == (3, 2, 3)
    assert positions[:, 0].tolist() == [[4, 5, 6]] * 3
    assert positions[:, 1].tolist() == [[0, 1, 2]] * 3


def test_an_image_whose_tokens_do_not_fill_its_grid_is_refused():
    inputs = Qwen2VLImageInputs(np.zeros((24, 1176), np.float32), (1, 4, 6))
    image = PromptImage(0, 5, "short", inputs)
    with pytest.raises(ValueError, match="cannot have the merged grid"):
        row_positions(RowImages(0, (image,)), 5, merge_size=2)


def test_patch_positions_are_grouped_by_merge_block():
    positions = patch_positions((1, 2, 4), merge_size=2)
    assert positions.tolist() == [
        [0, 0], [0, 1], [1, 0], [1, 1],
        [0, 2], [0, 3], [1, 2], [1, 3],
    ]  # fmt: skip


def test_windows_tile_the_merged_grid_from_the_top_left():
    # A 3 x 3 merged grid in 2 x 2-token windows (window_size 56 px = 2 merged patches).
    order = window_order((1, 6, 6), merge_size=2, window_size=56, patch_size=14)
    ids = window_ids((1, 6, 6), merge_size=2, window_size=56, patch_size=14)
    assert order.tolist() == [0, 1, 3, 4, 2, 5, 6, 7, 8]
    assert ids.tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 3]


def test_attention_groups_pad_short_groups_and_put_every_token_back():
    groups = make_attention_groups(np.array([0, 0, 0, 1, 2, 2]))
    assert groups is not None
    assert groups.gather.tolist() == [[0, 1, 2], [3, 3, 3], [4, 5, 5]]
    assert groups.key_mask[:, 0, 0].tolist() == [
        [True, True, True],
        [True, False, False],
        [True, True, False],
    ]
    assert groups.slot_of_token.tolist() == [0, 1, 2, 3, 6, 7]
    assert make_attention_groups(np.zeros(5, dtype=np.int64)) is None
    with pytest.raises(ValueError, match="consecutive"):
        make_attention_groups(np.array([0, 1, 0]))


def test_a_config_lacking_a_field_is_a_load_error_naming_it():
    with pytest.raises(ModelLoadError, match="lacks 'vision_config'"):
        parse_config(
            {
                "model_type": "qwen2_vl",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
                "image_token_id": 5,
            }
        )
