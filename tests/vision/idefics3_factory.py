"""A tiny random-weight Idefics3 (SmolVLM) model written as a Hugging Face folder.

transformers' own `Idefics3ForConditionalGeneration` writes the weights (fixed seed), so the
tensor names are the real ones; `Idefics3Processor.save_pretrained` writes the preprocessor
config, the tokenizer with the family's special tokens and SmolVLM's chat template. Needs
torch (a test-only dependency).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf

# SmolVLM-Instruct's chat template: an image content part is written as `<image>`.
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
)
IMAGE_SIZE = 32  # the vision tower's tile side, pixels
PATCH_SIZE = 4
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2  # tokens per tile


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_symbols = [gguf.vocab.bytes_to_unicode()[byte] for byte in range(256)]
    merges = ["h e", "l l", "o Ġ", "he ll"]
    tokens = [*SPECIAL_TOKENS, *byte_symbols, *(m.replace(" ", "") for m in merges)]
    vocabulary = {token: i for i, token in enumerate(tokens)}
    bpe = models.BPE(vocabulary, [tuple(m.split(" ")) for m in merges])
    backend = Tokenizer(bpe)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )


def write_idefics3_model(
    folder: Path,
    *,
    model_type: str = "idefics3",
    do_image_splitting: bool = True,
    tie_word_embeddings: bool = False,
    seed: int = 0,
) -> Path:
    """Write a tiny random Idefics3 (or, with `model_type="smolvlm"`, SmolVLM) folder.

    Tiles are 32x32 pixels (8x8 patches of 4 pixels, shuffled by 2 into 16 tokens); images
    are resized to a longest edge of 64, so a square image becomes 2x2 tiles and the global
    image when `do_image_splitting`. SmolVLM folders name their processor classes as the
    published ones do (transformers' SmolVLM processor itself needs num2words).
    """
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
    )

    config_class, model_class = {
        "idefics3": (Idefics3Config, Idefics3ForConditionalGeneration),
        "smolvlm": (SmolVLMConfig, SmolVLMForConditionalGeneration),
    }[model_type]

    tokenizer = _tokenizer()
    config = config_class(
        text_config={
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": tie_word_embeddings,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
        },
        scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    model = model_class(config).eval()
    # Random init leaves norms at one and biases at zero; perturb every tensor so that a
    # misplaced weight shows in the outputs.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(folder)
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 2 * IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
        do_image_splitting=do_image_splitting,
    )
    processor = Idefics3Processor(
        image_processor, tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=SMOLVLM_TEMPLATE
    )
    processor.save_pretrained(folder)
    if model_type == "smolvlm":
        processor_config = json.loads((folder / "processor_config.json").read_text())
        processor_config["processor_class"] = "SmolVLMProcessor"
        processor_config["image_processor"]["image_processor_type"] = "SmolVLMImageProcessor"
        (folder / "processor_config.json").write_text(json.dumps(processor_config))
    return folder
