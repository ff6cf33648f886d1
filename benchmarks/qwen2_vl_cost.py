"""Qwen2-VL / Qwen2.5-VL at real shapes on random weights: vision-tower time per image,
prefill of a prompt holding an image against a text prompt of the same length, and the decode
step of a sequence with an image against a text-only one (multimodal RoPE's cost).

Random weights measure speed only (DESIGN.md). Times are medians of `--repeats` runs after
one warm-up, each ending in `mx.eval`.

    python benchmarks/qwen2_vl_cost.py --family qwen2_vl --image-sides 448,896
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from mlxcel_core.cache import DenseKVCache
from mlxcel_core.images import PromptImage, RowImages
from mlxcel_vision.families.qwen2_vl.config import parse_config
from mlxcel_vision.families.qwen2_vl.image_inputs import Qwen2VLImageInputs
from mlxcel_vision.families.qwen2_vl.text import MultimodalRoPE, Qwen2VLTextDecoder
from mlxcel_vision.families.qwen2_vl.vision import VisionTower
from mlxcel_vision.text_decoder import make_text_model

# Qwen2-VL-2B-Instruct and Qwen2.5-VL-3B-Instruct as their config.json files give them.
_TEXT = {
    "qwen2_vl": dict(
        hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        intermediate_size=8960, tie_word_embeddings=True,
    ),
    "qwen2_5_vl": dict(
        hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
        intermediate_size=11008, tie_word_embeddings=True,
    ),
}  # fmt: skip
_VISION = {
    "qwen2_vl": dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, hidden_size=1536),
    "qwen2_5_vl": dict(
        depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
        window_size=112, fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu",
    ),
}  # fmt: skip


def make_config(family: str) -> dict:
    return {
        "model_type": family,
        **_TEXT[family],
        "vocab_size": 151936,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "image_token_id": 151655,
        "vision_config": {
            **_VISION[family],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_chans": 3,
        },
    }


def median_seconds(run: Callable[[], mx.array], repeats: int) -> float:
    mx.eval(run())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(run())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def prefill_and_decode(
    decoder: Qwen2VLTextDecoder,
    embeddings: mx.array,
    prefill_rows: list[RowImages] | None,
    decode_rows: list[RowImages] | None,
    repeats: int,
) -> tuple[float, float]:
    """Median seconds of prefilling `embeddings` (1, L, hidden) and of one decode step after."""

    def prefill() -> tuple[mx.array, list[DenseKVCache]]:
        cache = [DenseKVCache() for _ in range(decoder.num_layers)]
        return decoder(embeddings, cache, images=prefill_rows, last_only=True), cache

    prefill_seconds = median_seconds(lambda: prefill()[0], repeats)
    _, cache = prefill()
    mx.eval([layer_cache.state for layer_cache in cache])
    step = embeddings[:, :1]

    def decode() -> mx.array:
        logits = decoder(step, cache, images=decode_rows)
        for layer_cache in cache:
            layer_cache.trim(1)
        return logits

    return prefill_seconds, median_seconds(decode, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(_TEXT), default="qwen2_vl")
    parser.add_argument("--image-sides", default="448,896", help="square image sides, pixels")
    parser.add_argument("--text-tokens", type=int, default=64, help="text around the image")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    settings = parse_config(make_config(args.family))
    dtype = mx.bfloat16
    tower = VisionTower(settings.vision)
    tower.set_dtype(dtype)
    language_model = make_text_model(settings.text)
    language_model.set_dtype(dtype)
    head_dim = settings.text["hidden_size"] // settings.text["num_attention_heads"]
    rope = MultimodalRoPE(head_dim, settings.rope_theta, settings.mrope_section)
    decoder = Qwen2VLTextDecoder(language_model, rope, settings.vision.merge_size)
    mx.eval(tower.parameters(), language_model.parameters())
    print(f"{args.family} on {mx.default_device()}, bf16, medians of {args.repeats}")

    rng = np.random.default_rng(0)
    for side in (int(s) for s in args.image_sides.split(",")):
        grid = (1, side // 14, side // 14)
        patches = rng.standard_normal((grid[1] * grid[2], settings.vision.patch_dim))
        inputs = Qwen2VLImageInputs(patches.astype(np.float32), grid)
        num_tokens = grid[1] * grid[2] // 4
        vision = median_seconds(lambda inputs=inputs: tower(inputs), args.repeats)
        print(f"image {side}x{side} ({num_tokens} tokens): vision tower {vision * 1e3:.1f} ms")

        half = args.text_tokens // 2
        length = num_tokens + args.text_tokens
        image = PromptImage(half, num_tokens, "image", inputs)
        embeddings = mx.random.normal((1, length, settings.text["hidden_size"])).astype(dtype)
        image_rows = ([RowImages(0, (image,))], [RowImages(length, (image,))])
        results = {
            "image": prefill_and_decode(decoder, embeddings, *image_rows, args.repeats),
            "text": prefill_and_decode(decoder, embeddings, None, None, args.repeats),
        }
        print(
            f"  {length}-token prompt: "
            + ", ".join(
                f"{name} prefill {prefill * 1e3:.1f} ms, decode step {decode * 1e3:.2f} ms"
                for name, (prefill, decode) in results.items()
            )
        )


if __name__ == "__main__":
    main()
