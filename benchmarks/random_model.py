"""Write a random-weight model of a real architecture's shape as an mlx-lm folder.

Random weights measure speed faithfully (bytes moved, kernels launched) but nothing that
depends on what the model predicts (DESIGN.md, "Benchmarks on random weights").

    python benchmarks/random_model.py llama-3.2-1b /tmp/llama-1b
    python benchmarks/random_model.py llama-3.1-8b /tmp/llama-8b-4bit --bits 4
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models import llama
from mlx_lm.utils import quantize_model, save_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SHAPES = {
    "tiny": {
        "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 512, "tie_word_embeddings": True,
    },
    "llama-3.2-1b": {
        "hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "vocab_size": 128256, "tie_word_embeddings": True,
    },
    "llama-3.1-8b": {
        "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 128256, "tie_word_embeddings": False,
    },
}  # fmt: skip
EOS = "<|end_of_text|>"
# Served models need a chat template; this one marks each turn with its role.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE vocabulary padded to `vocab_size` with unmergeable filler tokens, and
    a chat template."""
    byte_tokens = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: index for index, token in enumerate(sorted(byte_tokens))}
    for index in range(len(vocab), vocab_size - 1):
        vocab[f"<filler_{index}>"] = index
    tokenizer = Tokenizer(models.BPE(vocab, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS])
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "eos_token": EOS,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def model_config(shape: str) -> dict:
    """The config.json of a Llama model of `shape` (a key of `SHAPES`)."""
    return {
        "model_type": "llama",
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        **SHAPES[shape],
    }


def make_random_model(
    shape: str, *, bits: int | None = None, seed: int = 0
) -> tuple[llama.Model, dict]:
    """A bf16 mlx-lm Llama of `shape` with mlx-lm's random initialization, its weights
    evaluated one layer at a time (so the float32 initial values of one layer at most are
    held beside the bf16 ones), quantized to `bits` with group size 64 if given; and its
    config."""
    config = model_config(shape)
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.update(tree_map(lambda a: a.astype(mx.bfloat16), model.parameters()))
    for layer in model.model.layers:
        mx.eval(layer.parameters())
    mx.eval(model.parameters())
    if bits is not None:
        return quantized_copy(model, config, bits=bits)
    return model, config


def quantized_copy(model: llama.Model, config: dict, *, bits: int) -> tuple[llama.Model, dict]:
    """A copy of `model` with its linear and embedding layers quantized to `bits` (group
    size 64), evaluated, and its config; `model` keeps its own weights."""
    copy = twin(model, config)
    copy, config = quantize_model(copy, config, group_size=64, bits=bits)
    mx.eval(copy.parameters())
    return copy, config


def twin(model: llama.Model, config: dict) -> llama.Model:
    """Another module of `model`'s structure holding the very same weight arrays."""
    copy = llama.Model(llama.ModelArgs.from_dict(config))
    quantization = config.get("quantization")
    if quantization is not None:
        nn.quantize(copy, group_size=quantization["group_size"], bits=quantization["bits"])
    # The constructor's random values are replaced before anything evaluates them.
    copy.update(model.parameters())
    return copy


def write_random_model(shape: str, folder: Path, *, bits: int | None, seed: int = 0) -> None:
    model, config = make_random_model(shape, bits=bits, seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(folder, model)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(folder, config["vocab_size"])
    size = sum(a.nbytes for _, a in tree_flatten(model.parameters()))
    precision = "bf16" if bits is None else f"{bits}-bit"
    print(f"wrote {shape} ({precision}, {size / 2**30:.2f} GiB) to {folder}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--bits", type=int, choices=(4, 8), help="quantize (group size 64)")
    args = parser.parse_args()
    write_random_model(args.shape, args.folder, bits=args.bits)


if __name__ == "__main__":
    main()
