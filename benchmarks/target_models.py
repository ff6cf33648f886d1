"""Random-weight models built in memory for `gpu_targets.py`, held once and run by both
implementations: mlx-lm's module as mlx-lm runs it, and a twin module over the very same
weight arrays with mlxcel's compute options, wrapped as the engine runs it.

No file is written or read but the tokenizer's: random weights of the 8B shape take
seconds to draw on a GPU and a minute to save and load.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm import tokenizer_utils
from random_model import make_random_model, quantized_copy, twin, write_tokenizer

from mlxcel_models.compute import ComputeOptions, apply_compute_options
from mlxcel_models.language_model import MlxLmLanguageModel
from mlxcel_models.tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineModel:
    """What `batched_decode.run_mlxcel` needs of a loaded model."""

    model: MlxLmLanguageModel
    tokenizer: Tokenizer


@dataclass(frozen=True)
class TargetModel:
    """One model of the target table, for both implementations.

    Attributes:
        name: as the table names it (`"8B 4-bit"`).
        reference: mlx-lm's module: the file's dtypes and MLX's kernels.
        reference_tokenizer: mlx-lm's tokenizer of the same vocabulary.
        ours: the twin module with mlxcel's compute options, and mlxcel's tokenizer.
        config: the model's config.json.
        decode_bytes: weight bytes a decode step reads: every parameter except an untied
            embedding table, of which it reads one row per token.
        kv_bytes_per_token: bytes of keys and values one position holds in the model's
            dtype, over all layers.
    """

    name: str
    reference: nn.Module
    reference_tokenizer: tokenizer_utils.TokenizerWrapper
    ours: EngineModel
    config: dict
    decode_bytes: int
    kv_bytes_per_token: int


def _parameter_bytes(module: nn.Module) -> int:
    return sum(a.nbytes for _, a in tree_flatten(module.parameters()))


def _target_model(name: str, module: nn.Module, config: dict, tokenizer_dir: Path) -> TargetModel:
    ours = twin(module, config)
    apply_compute_options(ours, ComputeOptions.for_device(mx.default_device()))
    mx.eval(ours.parameters())
    decode_bytes = _parameter_bytes(module)
    if not config["tie_word_embeddings"]:
        decode_bytes -= _parameter_bytes(module.model.embed_tokens)
    head_dim = config["head_dim"]
    kv_bytes = 2 * config["num_key_value_heads"] * head_dim * mx.bfloat16.size
    return TargetModel(
        name,
        module,
        tokenizer_utils.load(tokenizer_dir),
        EngineModel(MlxLmLanguageModel(ours), Tokenizer.from_folder(tokenizer_dir)),
        config,
        decode_bytes,
        kv_bytes * config["num_hidden_layers"],
    )


class ModelShelf:
    """Builds the table's models on first use and drops them on request.

    Args:
        small: the shape standing for the 1B model (`random_model.SHAPES`).
        large: the shape standing for the 8B model.
    """

    def __init__(self, small: str, large: str) -> None:
        self.small = small
        self.large = large
        self._models: dict[str, TargetModel] = {}
        self._tokenizers = tempfile.TemporaryDirectory(prefix="gpu-targets-")

    def get(self, key: str) -> TargetModel:
        """`"1b"`, `"8b"` or `"8b4"` (the 8B shape's 4-bit copy, group size 64)."""
        if key not in self._models:
            self._models[key] = self._build(key)
        return self._models[key]

    def drop(self, key: str) -> None:
        self._models.pop(key, None)
        mx.clear_cache()

    def _build(self, key: str) -> TargetModel:
        shape = self.small if key == "1b" else self.large
        if key == "8b4":
            bf16 = self.get("8b")
            module, config = quantized_copy(bf16.reference, bf16.config, bits=4)
        else:
            module, config = make_random_model(shape)
        folder = Path(self._tokenizers.name) / str(config["vocab_size"])
        if not folder.exists():
            folder.mkdir()
            write_tokenizer(folder, config["vocab_size"])
        names = {"1b": "1B bf16", "8b": "8B bf16", "8b4": "8B 4-bit"}
        return _target_model(names[key], module, config, folder)
