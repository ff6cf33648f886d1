"""A `TextDecoder` over one of mlx-lm's text models, run on embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcel_core.cache import KVCache
from mlxcel_core.images import RowImages
from mlxcel_models.cache_attention import route_attention_through_caches
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.mlx_lm_models import make_mlx_lm_model


def make_text_model(text_config: dict[str, Any]) -> nn.Module:
    """mlx-lm's model for a complete text config (see `mlxcel_models.vlm_config`).

    Raises:
        ModelLoadError: mlx-lm has no such model type, or the config does not fit it.
    """
    try:
        return make_mlx_lm_model(text_config, where="the text config")
    except ModuleNotFoundError as error:
        raise ModelLoadError(
            f"unsupported text model type '{text_config['model_type']}' in a vision-language model"
        ) from error
    except (TypeError, ValueError) as error:
        raise ModelLoadError(f"the text config does not describe a model: {error}") from error


class MlxLmTextDecoder:
    """An mlx-lm decoder (`module.model`, then a tied or separate LM head) on embeddings.

    Models whose positions do not depend on images (plain RoPE) ignore `images`. Its
    attention layers let caches that compute attention do so (the paged decode kernel,
    `route_attention_through_caches`).

    Args:
        module: an mlx-lm `Model` whose body accepts `input_embeddings` (llama, mistral,
            qwen2 and most of mlx-lm's decoders).
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._body = module.model
        self._tied = bool(module.args.tie_word_embeddings)
        route_attention_through_caches(module)

    @property
    def num_layers(self) -> int:
        return len(self._body.layers)

    def embed(self, tokens: mx.array) -> mx.array:
        return self._body.embed_tokens(tokens)

    def __call__(
        self,
        embeddings: mx.array,
        cache: Sequence[KVCache],
        *,
        images: Sequence[RowImages] | None = None,
        last_only: bool = False,
    ) -> mx.array:
        hidden = self._body(None, cache=cache, input_embeddings=embeddings)
        if last_only:
            hidden = hidden[:, -1:, :]
        if self._tied:
            return self._body.embed_tokens.as_linear(hidden)
        return self.module.lm_head(hidden)
