"""mlx-vlm's side of benchmarks/vlm_bench.py, run with mlx-vlm's own interpreter.

It imports nothing of mlxcel: mlx-vlm lives in a separate environment and never enters
mlxcel's dependencies. It loads the folder named on the command line, prints
`{"ready": true}`, then answers one JSON request per line of stdin with one JSON line:

    {"op": "encode", "image": PATH}  ->  {"seconds": S}
    {"op": "ttft", "image": PATH}    ->  {"seconds": S, "prompt_tokens": N}

`encode` times the vision tower, feature selection and projector on the image's pixel
values (preprocessed before the clock starts), as mlx-vlm's LLaVA `get_input_embeddings`
runs them; `ttft` times `stream_generate` from the image file to its first token (greedy).
"""

from __future__ import annotations

import json
import sys
import time

import mlx.core as mx
from mlx_vlm import apply_chat_template, load, stream_generate
from PIL import Image

PROMPT = "Describe the image."
# Tokenizer options mlx-vlm 0.7.10's LlavaProcessor passes on to the image processor, which
# transformers 5 refuses ("unexpected keyword argument 'padding'").
TEXT_ONLY_OPTIONS = ("padding", "padding_side")


class ImageProcessorWithoutTextOptions:
    """The processor's image processor, called without the tokenizer's options."""

    def __init__(self, image_processor) -> None:
        self._image_processor = image_processor

    def __call__(self, images, **kwargs):
        options = {key: value for key, value in kwargs.items() if key not in TEXT_ONLY_OPTIONS}
        return self._image_processor(images, **options)

    def __getattr__(self, name: str):
        return getattr(self._image_processor, name)


def encode_seconds(model, processor, image_path: str) -> float:
    """Wall seconds of one image through the tower and projector, evaluated."""
    pixels = processor.image_processor(images=[Image.open(image_path)], return_tensors="np")
    pixel_values = mx.array(pixels["pixel_values"])
    mx.eval(pixel_values)
    start = time.perf_counter()
    *_, hidden_states = model.vision_tower(
        pixel_values.transpose(0, 2, 3, 1), output_hidden_states=True
    )
    selected = hidden_states[model.vision_feature_layer]
    if model.vision_feature_select_strategy == "default":
        selected = selected[:, 1:]
    mx.eval(model.multi_modal_projector(selected))
    return time.perf_counter() - start


def ttft(model, processor, prompt: str, image_path: str) -> tuple[float, int]:
    """(wall seconds from the image file to the first generated token, prompt tokens)."""
    start = time.perf_counter()
    first = next(
        stream_generate(model, processor, prompt, image=[image_path], max_tokens=1, temperature=0.0)
    )
    return time.perf_counter() - start, first.prompt_tokens


def main() -> None:
    model, processor = load(sys.argv[1])
    processor.image_processor = ImageProcessorWithoutTextOptions(processor.image_processor)
    prompt = apply_chat_template(processor, model.config, PROMPT, num_images=1)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "encode":
            answer = {"seconds": encode_seconds(model, processor, request["image"])}
        else:
            seconds, prompt_tokens = ttft(model, processor, prompt, request["image"])
            answer = {"seconds": seconds, "prompt_tokens": prompt_tokens}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
