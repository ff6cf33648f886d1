"""Write a random-weight LLaVA folder of a real vision tower's shape, loadable by mlxcel
and mlx-vlm alike.

The model is transformers' own `LlavaForConditionalGeneration` (seeded random weights,
float32, under the names of llava-hf's checkpoints); the processor files are those of transformers'
`LlavaProcessor` (a CLIP image processor and a byte-level BPE tokenizer with `<image>` and a
ChatML template). Random weights measure speed faithfully, nothing about the answers
(DESIGN.md, "Benchmarks on random weights"). Needs torch (`uv pip install --find-links
/opt/wheels 'torch==2.13.0+cpu'`).

    python benchmarks/random_vlm.py clip-vit-b16 448 /tmp/llava-b16-448
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

# Vision towers at the shapes of OpenAI's CLIP checkpoints (the configs of
# openai/clip-vit-base-patch16 and openai/clip-vit-large-patch14).
VISION_TOWERS = {
    "clip-vit-b16": {
        "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
        "num_attention_heads": 12, "patch_size": 16, "projection_dim": 512,
    },
    "clip-vit-l14": {
        "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
        "num_attention_heads": 16, "patch_size": 14, "projection_dim": 768,
    },
}  # fmt: skip
# A small llama decoder: what it adds to the time to first token is a prefill of the
# image's tokens; the vision tower's cost is what the benchmark is about.
TEXT_MODEL = {
    "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
    "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32064,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
}  # fmt: skip
IMAGE_TOKEN = "<image>"
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", IMAGE_TOKEN)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# CLIP's normalization constants (transformers' OPENAI_CLIP_MEAN / OPENAI_CLIP_STD).
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def make_tokenizer():
    """A `PreTrainedTokenizerFast` of the text model's vocabulary size: the 256 byte-level
    tokens, unmergeable filler tokens, then the special tokens (a random model samples any
    id, so every id must decode)."""
    from transformers import PreTrainedTokenizerFast

    byte_tokens = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate(byte_tokens)}
    for index in range(len(vocab), TEXT_MODEL["vocab_size"] - len(SPECIAL_TOKENS)):
        vocab[f"<filler_{index}>"] = index
    backend = Tokenizer(models.BPE(vocab, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        chat_template=CHAT_TEMPLATE,
    )


def _earlier_name(name: str) -> str:
    """A transformers 5 LLaVA weight name as llava-hf checkpoints spell it, the layout
    mlx-vlm's loader reads (mlxcel reads both)."""
    prefixes = {
        "model.vision_tower.": "vision_tower.vision_model.",
        "model.multi_modal_projector.": "multi_modal_projector.",
        "model.language_model.": "language_model.model.",
        "lm_head.": "language_model.lm_head.",
    }
    for prefix, earlier in prefixes.items():
        if name.startswith(prefix):
            return earlier + name.removeprefix(prefix)
    raise ValueError(f"unexpected LLaVA weight name {name!r}")


def write_random_llava(tower: str, image_size: int, folder: Path, *, seed: int = 0) -> Path:
    """Write a random LLaVA 1.5 model: the `tower` CLIP shape at `image_size` pixels
    (position embeddings for (image_size / patch_size)² patches), a 2-layer GELU projector
    and the `TEXT_MODEL` llama, float32.

    Args:
        tower: a key of `VISION_TOWERS`.
        image_size: the tower's input side in pixels, a multiple of its patch size.
        folder: created if missing.

    Returns:
        The folder.

    Raises:
        ValueError: an unknown tower, or an image size its patches do not divide.
    """
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    if tower not in VISION_TOWERS:
        raise ValueError(f"tower must be one of {sorted(VISION_TOWERS)}, got {tower!r}")
    patch_size = VISION_TOWERS[tower]["patch_size"]
    if image_size % patch_size:
        raise ValueError(f"image_size must be a multiple of {patch_size}, got {image_size}")
    tokenizer = make_tokenizer()
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    torch.manual_seed(seed)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(**VISION_TOWERS[tower], image_size=image_size),
        text_config=LlamaConfig(**TEXT_MODEL, bos_token_id=tokenizer.bos_token_id,
                                eos_token_id=tokenizer.eos_token_id),
        image_token_index=image_token_id,
        image_seq_length=(image_size // patch_size) ** 2,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )  # fmt: skip
    model = LlavaForConditionalGeneration(config)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    weights = {
        _earlier_name(name): np.ascontiguousarray(value.detach().numpy())
        for name, value in model.state_dict().items()
    }
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        resample=3,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
    )
    processor.save_pretrained(folder)
    # transformers 5 folds the image processor into processor_config.json; mlxcel reads
    # it from preprocessor_config.json, as earlier versions wrote it.
    image_processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tower", choices=sorted(VISION_TOWERS))
    parser.add_argument("image_size", type=int)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    write_random_llava(args.tower, args.image_size, args.folder)
    print(f"wrote a random LLaVA ({args.tower}, {args.image_size} px) to {args.folder}")


if __name__ == "__main__":
    main()
