"""What mlxcel knows about each model family: kind, loading formats, capabilities."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_architectures import gguf_model_types


class ModelKind(StrEnum):
    TEXT = "text"
    VLM = "vlm"
    AUDIO = "audio"


class WeightFormat(StrEnum):
    GGUF = "gguf"
    SAFETENSORS = "safetensors"


@dataclass(frozen=True)
class FamilyMetadata:
    """One model family as `config.json`'s `model_type` (or GGUF's architecture) names it.

    Attributes:
        model_type: the `model_type` / `general.architecture` value.
        kind: text, vision-language or audio.
        formats: weight formats mlxcel loads for this family.
        supports_adapters: LoRA adapters can be attached.
        supports_tensor_parallel: its layers can be sharded across devices.
        supports_pipeline_parallel: its layers can be split into stages across devices.
    """

    model_type: str
    kind: ModelKind
    formats: frozenset[WeightFormat]
    supports_adapters: bool
    supports_tensor_parallel: bool = False
    supports_pipeline_parallel: bool = False


_BOTH = frozenset(WeightFormat)
_SAFETENSORS_ONLY = frozenset({WeightFormat.SAFETENSORS})

FAMILIES: dict[str, FamilyMetadata] = {
    family.model_type: family
    for family in (
        FamilyMetadata(
            "llama",
            ModelKind.TEXT,
            _BOTH,
            True,
            supports_tensor_parallel=True,
            supports_pipeline_parallel=True,
        ),
        FamilyMetadata(
            "mistral",
            ModelKind.TEXT,
            _SAFETENSORS_ONLY,
            True,
            supports_tensor_parallel=True,
            supports_pipeline_parallel=True,
        ),
        FamilyMetadata(
            "qwen2",
            ModelKind.TEXT,
            _BOTH,
            True,
            supports_tensor_parallel=True,
            supports_pipeline_parallel=True,
        ),
        FamilyMetadata(
            "qwen3",
            ModelKind.TEXT,
            _BOTH,
            True,
            supports_tensor_parallel=True,
            supports_pipeline_parallel=True,
        ),
        FamilyMetadata("llava", ModelKind.VLM, _SAFETENSORS_ONLY, False),
        FamilyMetadata("llava_next", ModelKind.VLM, _SAFETENSORS_ONLY, False),
        FamilyMetadata("qwen2_vl", ModelKind.VLM, _SAFETENSORS_ONLY, False),
        FamilyMetadata("qwen2_5_vl", ModelKind.VLM, _SAFETENSORS_ONLY, False),
        FamilyMetadata("idefics3", ModelKind.VLM, _SAFETENSORS_ONLY, False),
        FamilyMetadata("smolvlm", ModelKind.VLM, _SAFETENSORS_ONLY, False),
    )
}


def family_for(model_type: str, weight_format: WeightFormat) -> FamilyMetadata:
    """The family metadata for `model_type` in `weight_format`; the GGUF families are
    those `loading.gguf_architectures` maps.

    Raises:
        ModelLoadError: the type is unknown or not loadable from this format.
    """
    family = FAMILIES.get(model_type)
    if weight_format is WeightFormat.GGUF and model_type in gguf_model_types():
        return family or FamilyMetadata(
            model_type, ModelKind.TEXT, frozenset({WeightFormat.GGUF}), False
        )
    if family is None or weight_format not in family.formats:
        supported = sorted(t for t, f in FAMILIES.items() if weight_format in f.formats)
        if weight_format is WeightFormat.GGUF:
            supported = sorted(gguf_model_types())
        raise ModelLoadError(
            f"unsupported model type '{model_type}' for {weight_format.value} files; "
            f"supported: {', '.join(supported)}"
        )
    return family
