"""A SmolVLM model, whose images are several tiles (one `PromptImage` each), through the
continuous-batching engine and `generate --image`."""

from __future__ import annotations

import dataclasses
import io

import mlx.core as mx
import numpy as np
import pytest
from engine_runs import greedy_alone, greedy_request, run_engine, tokens_of
from idefics3_factory import write_idefics3_model
from PIL import Image
from test_vision_model import CountingEncoder

from mlxcel.cli import main
from mlxcel_core.engine import EngineConfig, SchedulerConfig
from mlxcel_core.request import GenerationConfig
from mlxcel_models.compute import ComputeOptions
from mlxcel_vision.loading import load_vision_model
from mlxcel_vision.model import VisionLanguageModel

pytest.importorskip("torch")

GENERATION = GenerationConfig(context_size=256, max_tokens=6)
CONFIG = EngineConfig(
    scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_chunk=24),
    context_size=256,
    block_size=8,
    num_kv_blocks=160,
)
QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_idefics3_model(tmp_path_factory.mktemp("engine") / "smolvlm", model_type="smolvlm")


@pytest.fixture(scope="module")
def loaded(folder):
    return load_vision_model(folder, compute=ComputeOptions(float_dtype=mx.float32))


def picture() -> Image.Image:
    pixels = np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def chat_prompt(loaded, content: list[dict], images: list[Image.Image]):
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": content}])
    return loaded.image_prompter.encode(text, images)


def test_tiled_image_requests_in_the_engine_match_a_greedy_loop(loaded):
    image_prompt = chat_prompt(
        loaded, [{"type": "image"}, {"type": "text", "text": QUESTION}], [picture()]
    )
    text_prompt = chat_prompt(loaded, [{"type": "text", "text": "Name three colours."}], [])
    encoder = CountingEncoder(loaded.model.parts.encoder)
    counting = VisionLanguageModel(dataclasses.replace(loaded.model.parts, encoder=encoder))

    # Prefilled in chunks of 24 beside a text request, so chunks end inside tiles; then the
    # same image again, its blocks from the prefix cache.
    first, text, again = run_engine(
        counting,
        CONFIG,
        [
            [
                greedy_request(image_prompt, 0, GENERATION),
                greedy_request(text_prompt, 1, GENERATION),
            ],
            [greedy_request(image_prompt, 2, GENERATION)],
        ],
    )

    assert len(image_prompt.images) == 5  # 2 x 2 tiles and the global image
    assert tokens_of(first) == greedy_alone(loaded.model, image_prompt, GENERATION.max_tokens)
    assert tokens_of(text) == greedy_alone(loaded.model, text_prompt, GENERATION.max_tokens)
    assert tokens_of(again) == tokens_of(first)
    assert encoder.calls == len(image_prompt.images)  # each tile encoded once
    assert again[-1].stats.cached_tokens > image_prompt.images[-1].stop - 8


def test_generate_with_an_image_counts_every_tile(loaded, folder, tmp_path):
    image = tmp_path / "picture.png"
    picture().save(image)
    prompt = chat_prompt(
        loaded, [{"type": "image"}, {"type": "text", "text": QUESTION}], [picture()]
    )
    out, err = io.StringIO(), io.StringIO()

    code = main(
        [
            "generate", "-m", str(folder), "-p", QUESTION, "--image", str(image),
            "--temp", "0", "-n", str(GENERATION.max_tokens), "-c", "256",
        ],
        environ={},
        out=out,
        err=err,
    )  # fmt: skip

    assert code == 0, err.getvalue()
    assert f"prompt: {len(prompt.prompt_ids)} tokens" in err.getvalue()
    expected = loaded.tokenizer.decode(greedy_alone(loaded.model, prompt, GENERATION.max_tokens))
    assert out.getvalue() == expected + "\n"
