"""A Gemma 3n GGUF whose per-layer embedding the converter padded with zero rows to the
full vocabulary (the vision and audio tokens) loads, and matches mlx-lm's model with the
unpadded per-layer vocabulary on text token ids."""

from dataclasses import replace

import mlx.core as mx
import numpy as np

from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.loading.gguf_model import load_gguf_model

from gguf_gemma_families import GEMMA_FAMILIES, stack_altup_projections
from gguf_models import VOCAB_SIZE, make_reference, write_converted_gguf

PER_LAYER_VOCAB = 200
TEXT_PROMPT = [5, 80, 81, 17, 42, 9, 33, 7, 199]


def pad_per_layer_embedding(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    converted = stack_altup_projections(weights)
    name = "model.language_model.embed_tokens_per_layer.weight"
    table = converted[name]
    padding = np.zeros((VOCAB_SIZE - table.shape[0], table.shape[1]), table.dtype)
    converted[name] = np.concatenate([table, padding])
    return converted


def test_padded_per_layer_embedding_matches_the_unpadded_model_on_text_tokens(tmp_path):
    family = GEMMA_FAMILIES["gemma3n"]
    text_config = family.config["text_config"] | {"vocab_size_per_layer_input": PER_LAYER_VOCAB}
    config = family.config | {"text_config": text_config}
    padded = replace(family, config=config, merge_tensors=pad_per_layer_embedding)
    reference, weights = make_reference(config)
    path = write_converted_gguf(tmp_path / "m.gguf", padded, weights)
    loaded = load_gguf_model(path, read_gguf_header(path, arrays=True))
    assert loaded.config["text_config"]["vocab_size_per_layer_input"] == VOCAB_SIZE
    tokens = mx.array([TEXT_PROMPT])
    np.testing.assert_allclose(
        np.array(loaded.module(tokens)), np.array(reference(tokens)), atol=1e-4, rtol=1e-4
    )
