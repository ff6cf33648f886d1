"""Tiny random-weight Qwen2-VL and Qwen2.5-VL folders, written by transformers' own classes.

Each folder is what a Hugging Face checkpoint holds: config.json, model.safetensors (the real
weight names, float32), preprocessor_config.json (small min/max pixels), a byte-level
tokenizer with Qwen's special tokens, and a chat template writing the image marker. Writing
them needs torch (a test-only dependency).
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
)
IMAGE_MARKER = "<|vision_start|><|image_pad|><|vision_end|>"
# Qwen2-VL's template, reduced to the parts a prompt with images uses.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}" + IMAGE_MARKER + "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PATCH_SIZE = 14
MERGE_SIZE = 2
MIN_PIXELS = 28 * 28
MAX_PIXELS = 84 * 84
# Weights drawn wider than transformers' default 0.02, so that attention is far from uniform
# and a wrong rotary position changes the logits well beyond the parity tolerance.
INITIALIZER_RANGE = 0.2


def _write_tokenizer(folder: Path) -> int:
    """Write a byte-level BPE tokenizer with Qwen's special tokens; return its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *alphabet])}
    tokenizer = Tokenizer(models.BPE(vocab, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHAT_TEMPLATE,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )
    return len(vocab)


def _write_preprocessor_config(folder: Path, processor_class: str) -> None:
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Qwen2VLImageProcessor",
                "processor_class": processor_class,
                "do_resize": True,
                "do_rescale": True,
                "do_normalize": True,
                "do_convert_rgb": True,
                "rescale_factor": 1 / 255,
                "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711],
                "min_pixels": MIN_PIXELS,
                "max_pixels": MAX_PIXELS,
                "patch_size": PATCH_SIZE,
                "temporal_patch_size": 2,
                "merge_size": MERGE_SIZE,
            }
        )
    )


def _text_config(vocab_size: int, *, tie_embeddings: bool) -> dict:
    return {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab_size,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tie_embeddings,
        "initializer_range": INITIALIZER_RANGE,
        # head_dim 16: 8 rotary frequencies split over (temporal, height, width).
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
        },
        "bos_token_id": None,
        "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>"),
    }


def _token_ids() -> dict:
    index = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return {
        "image_token_id": index["<|image_pad|>"],
        "video_token_id": index["<|endoftext|>"],
        "vision_start_token_id": index["<|vision_start|>"],
        "vision_end_token_id": index["<|vision_end|>"],
        "eos_token_id": index["<|im_end|>"],
    }


def _save(model, folder: Path) -> Path:
    model.eval()
    model.save_pretrained(folder)
    return folder


def write_qwen2_vl(folder: Path, *, seed: int = 0, tie_embeddings: bool = False) -> Path:
    """Write a 2-layer random Qwen2-VL folder (vision: 2 blocks of width 32, full attention)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = _write_tokenizer(folder)
    _write_preprocessor_config(folder, "Qwen2VLProcessor")
    config = Qwen2VLConfig(
        text_config=_text_config(vocab_size, tie_embeddings=tie_embeddings),
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
            "in_channels": 3,
            "initializer_range": INITIALIZER_RANGE,
        },
        tie_word_embeddings=tie_embeddings,
        initializer_range=INITIALIZER_RANGE,
        **_token_ids(),
    )
    torch.manual_seed(seed)
    return _save(Qwen2VLForConditionalGeneration(config).to(torch.float32), folder)


def write_qwen2_5_vl(folder: Path, *, seed: int = 0, tie_embeddings: bool = False) -> Path:
    """Write a 2-layer random Qwen2.5-VL folder (vision: 3 blocks of width 32; blocks 0 and 1
    attend in 2x2-token windows, block 2 over the whole image)."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = _write_tokenizer(folder)
    _write_preprocessor_config(folder, "Qwen2_5_VLProcessor")
    config = Qwen2_5_VLConfig(
        text_config=_text_config(vocab_size, tie_embeddings=tie_embeddings),
        vision_config={
            "depth": 3,
            "hidden_size": 32,
            "intermediate_size": 64,
            "out_hidden_size": 64,
            "num_heads": 2,
            "hidden_act": "silu",
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
            "in_channels": 3,
            "window_size": 2 * MERGE_SIZE * PATCH_SIZE,
            "fullatt_block_indexes": [2],
            "initializer_range": INITIALIZER_RANGE,
        },
        tie_word_embeddings=tie_embeddings,
        initializer_range=INITIALIZER_RANGE,
        **_token_ids(),
    )
    torch.manual_seed(seed)
    return _save(Qwen2_5_VLForConditionalGeneration(config).to(torch.float32), folder)
