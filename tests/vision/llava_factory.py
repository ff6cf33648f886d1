"""Tiny random-weight LLaVA folders built with transformers' own classes (torch, fixed seed),
in the layouts mlxcel loads: as `save_pretrained` writes them, with transformers 5's module
names, and as mlx-vlm converts them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from factories import SPECIAL_TOKENS, byte_level_vocab

IMAGE_TOKEN = "<image>"
LLAVA_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LAYOUTS = ("saved", "transformers5", "mlx_vlm")
# CLIP's normalization constants (transformers' OPENAI_CLIP_MEAN / OPENAI_CLIP_STD).
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


@dataclass(frozen=True)
class TinyLlava:
    """Shape of a tiny LLaVA: a 2-layer CLIP tower on 56 px images (16 patches) and a
    2-layer GQA llama."""

    image_size: int = 56
    patch_size: int = 14
    vision_hidden_size: int = 32
    text_hidden_size: int = 64
    feature_layer: int | list[int] = -2
    select_strategy: str = "default"
    text_model_type: str = "llama"
    # LLaVA-NeXT's anyres resolutions (height, width); None makes a LLaVA 1.5 model.
    grid_pinpoints: tuple[tuple[int, int], ...] | None = None
    seed: int = 0


def _vocabulary() -> tuple[list[str], list[str]]:
    tokens, merges, _ = byte_level_vocab()
    return [*tokens, IMAGE_TOKEN], merges


def image_token_id() -> int:
    """The id of `<image>` in the factory's vocabulary (its last token)."""
    return len(_vocabulary()[0]) - 1


def _write_tokenizer(folder: Path) -> None:
    tokens, merges = _vocabulary()
    bpe = models.BPE(
        {token: i for i, token in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges]
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([*SPECIAL_TOKENS, IMAGE_TOKEN])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "chat_template": LLAVA_TEMPLATE,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )


def _write_preprocessor_config(folder: Path, config: TinyLlava) -> None:
    anyres = {}
    if config.grid_pinpoints is not None:
        anyres = {
            "image_processor_type": "LlavaNextImageProcessor",
            "image_grid_pinpoints": [list(pinpoint) for pinpoint in config.grid_pinpoints],
            "do_pad": True,
        }
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "CLIPImageProcessor",
                "do_resize": True,
                "size": {"shortest_edge": config.image_size},
                "resample": 3,
                "do_center_crop": True,
                "crop_size": {"height": config.image_size, "width": config.image_size},
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": CLIP_MEAN,
                "image_std": CLIP_STD,
                "do_convert_rgb": True,
            }
            | anyres
        )
    )


def make_torch_llava(config: TinyLlava):
    """transformers' `LlavaForConditionalGeneration` (`LlavaNextForConditionalGeneration`
    with `grid_pinpoints`) with seeded random weights, float32; the calling test is skipped
    where PyTorch is not installed (it is no project dependency)."""
    torch = pytest.importorskip("torch")
    from transformers import (
        AutoConfig,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
    )

    torch.manual_seed(config.seed)
    vision = CLIPVisionConfig(
        hidden_size=config.vision_hidden_size,
        intermediate_size=2 * config.vision_hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=config.image_size,
        patch_size=config.patch_size,
        projection_dim=config.vision_hidden_size,
    )
    text = AutoConfig.for_model(
        config.text_model_type,
        hidden_size=config.text_hidden_size,
        intermediate_size=2 * config.text_hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(_vocabulary()[0]),
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
        bos_token_id=1,
        eos_token_id=2,
    )
    settings = dict(
        vision_config=vision,
        text_config=text,
        image_token_index=image_token_id(),
        image_seq_length=(config.image_size // config.patch_size) ** 2,
        vision_feature_layer=config.feature_layer,
        vision_feature_select_strategy=config.select_strategy,
    )
    if config.grid_pinpoints is None:
        return LlavaForConditionalGeneration(LlavaConfig(**settings)).eval()
    pinpoints = [list(pinpoint) for pinpoint in config.grid_pinpoints]
    next_config = LlavaNextConfig(**settings, image_grid_pinpoints=pinpoints)
    return LlavaNextForConditionalGeneration(next_config).eval()


def _relaid(folder: Path, layout: str, model) -> None:
    """Rewrite the saved weights under `layout`'s names."""
    weights = {name: value.detach().numpy() for name, value in model.state_dict().items()}
    if layout == "mlx_vlm":
        renamed = {}
        for name, value in weights.items():
            if name.startswith("model.vision_tower."):
                name = "vision_tower.vision_model." + name.removeprefix("model.vision_tower.")
                if name.endswith("patch_embedding.weight"):
                    value = value.transpose(0, 2, 3, 1)
            elif name.startswith("model.multi_modal_projector."):
                name = name.removeprefix("model.")
            elif name.startswith("model.language_model."):
                name = "language_model.model." + name.removeprefix("model.language_model.")
            elif name == "lm_head.weight":
                name = "language_model.lm_head.weight"
            elif name == "model.image_newline":
                name = "image_newline"
            renamed[name] = value
        weights = renamed
    mx.save_safetensors(
        str(folder / "model.safetensors"),
        {name: mx.array(np.ascontiguousarray(value)) for name, value in weights.items()},
    )


def write_llava_model(folder: Path, config: TinyLlava = TinyLlava(), layout: str = "saved"):
    """Write a tiny random LLaVA as a model folder: config.json, model.safetensors,
    preprocessor_config.json, a byte-level BPE tokenizer with `<image>` as a special token
    and a ChatML template writing `<image>` for image parts.

    Args:
        layout: "saved" as `save_pretrained` writes it, "transformers5" with transformers
            5's module names, "mlx_vlm" as mlx-vlm converts it.

    Returns:
        The folder.
    """
    model = make_torch_llava(config)
    model.save_pretrained(folder)
    if layout != "saved":
        _relaid(folder, layout, model)
    _write_tokenizer(folder)
    _write_preprocessor_config(folder, config)
    return folder
