"""One GGUF architecture's description: the mlx-lm family that runs it and what llama.cpp's
converter (`convert_hf_to_gguf.py`) changed on the way to GGUF, which the loader undoes.

The table of architectures is `gguf_architectures.GGUF_ARCHITECTURES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcel_models.loading.gguf_config import GGUFMetadata, common_config
from mlxcel_models.loading.gguf_layouts import TensorJoin

ConfigExtras = Callable[[GGUFMetadata, dict[str, Any]], dict[str, Any]]
RestoreTensor = Callable[[str, dict[str, mx.array], dict[str, Any]], dict[str, mx.array]]
MetadataWeights = Callable[[GGUFMetadata, dict[str, Any]], dict[str, mx.array]]
InstallRopeFactors = Callable[[nn.Module, mx.array, dict[str, Any]], None]
RouteTensor = Callable[[str, dict[str, Any]], tuple[str, ...] | None]


def _none(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class GGUFArchitecture:
    """One `general.architecture` value and how it becomes an mlx-lm model.

    Attributes:
        name: the GGUF architecture name (`gguf.MODEL_ARCH_NAMES`).
        model_type: the mlx-lm `model_type` that runs it.
        moe_model_type: the `model_type` when the file has experts (`expert_count`):
            llama.cpp writes Mixtral as `llama`.
        rope_permuted: the converter permuted the Q/K rows for llama.cpp's interleaved
            RoPE (`LlamaModel.permute`); the loader permutes them back.
        norm_offset: added by the converter to every norm weight (Gemma stores `1 + w`),
            subtracted by the loader.
        name_aliases: (mlx-lm fragment, fragment gguf's `TensorNameMap` knows) pairs for
            parameter names mlx-lm spells differently from the Hugging Face checkpoint.
        extras: config keys beyond `common_config`, from the metadata and the common keys.
        select_model_type: picks the `model_type` from the metadata where one GGUF
            architecture covers several mlx-lm families (DeepSeek V2 and V3).
        other_model_types: the families `select_model_type` picks besides `model_type`.
        tensor_join: tensors of a layer the loader joins into parameters (`gguf_layouts`).
        restore_tensor: undoes a family's own layout change on one converted tensor,
            given its GGUF base name (`attn_q`), its arrays and the config.
        metadata_weights: parameters the converter moved into the metadata (Apertus's
            xIELU constants), as mlx-lm parameter path → array.
        dropped_tensors: tensors (name within a layer, or whole name) the mlx-lm family
            discards when it loads the checkpoint or does not have, left out.
        base_config: the config keys the family shares with others of its kind
            (`common_config` for attention decoders; state-space models have no heads).
        reshaped_tensors: tensors (GGUF base name, `ssm_conv1d`) whose axes of size one the
            converter dropped or added; the loader reshapes them to the parameter's shape.
        rename_parameter: renames an mlx-lm parameter path, after `name_aliases`, where a
            plain fragment cannot (Nemotron-H's experts, which the converter names under
            another prefix than the rest of the layer).
        install_rope_factors: puts the `rope_freqs` factors on the model's attention
            layers where the family's RoPE differs from llama's (Llama 4); None for the
            llama layout.
        route_tensor: from a GGUF tensor's full name and the config, the mlx-lm parameter
            paths it holds where gguf-py's table cannot say: () leaves it out (Gemma 4's
            unused K/V of layers that share another's cache); several take one index each
            of its leading axis where it stacks them (Gemma 3n's `altup_proj`), else an
            equal share of its rows, axis -2 (a converter's fused gate/up experts), in any
            packing; None for the table's answer.
    """

    name: str
    model_type: str
    moe_model_type: str | None = None
    rope_permuted: bool = False
    norm_offset: float = 0.0
    name_aliases: tuple[tuple[str, str], ...] = ()
    extras: ConfigExtras = field(default=_none)
    select_model_type: Callable[[Mapping[str, Any]], str] | None = None
    other_model_types: tuple[str, ...] = ()
    tensor_join: TensorJoin | None = None
    restore_tensor: RestoreTensor | None = None
    metadata_weights: MetadataWeights | None = None
    dropped_tensors: frozenset[str] = frozenset()
    base_config: Callable[[GGUFMetadata], dict[str, Any]] = common_config
    reshaped_tensors: frozenset[str] = frozenset()
    rename_parameter: Callable[[str], str] | None = None
    install_rope_factors: InstallRopeFactors | None = None
    route_tensor: RouteTensor | None = None

    def model_type_for(self, metadata: Mapping[str, Any]) -> str:
        """The mlx-lm `model_type` of a file with this architecture."""
        if self.select_model_type is not None:
            return self.select_model_type(metadata)
        if self.moe_model_type is not None and metadata.get(f"{self.name}.expert_count"):
            return self.moe_model_type
        return self.model_type

    def config(self, meta: GGUFMetadata) -> dict[str, Any]:
        """The Hugging Face-style config mlx-lm builds this family from."""
        config = self.base_config(meta)
        config["model_type"] = self.model_type_for(meta.metadata)
        return config | self.extras(meta, config)
