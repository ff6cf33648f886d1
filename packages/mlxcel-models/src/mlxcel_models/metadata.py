"""What mlxcel knows about each model family: kind, loading formats, capabilities.

Text families are mlx-lm's (`mlx_lm_families`): every `model_type` mlx-lm 0.32 loads, with
what each supports derived from the caches its layers keep (`mlxcel_core.cache.layout`'s
rules over its cache kinds); those that load from GGUF files are the GGUF loader's
(`gguf_architectures`). Vision-language families are mlxcel-vision's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum

from mlxcel_core.cache.layout import (
    CacheKind,
    pipeline_stages_with,
    prefix_caching_with,
    speculative_decoding_with,
)
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_architectures import GGUF_ARCHITECTURES, gguf_model_types
from mlxcel_models.mlx_lm_families import (
    ONE_CONTEXT_PER_PASS,
    family_cache_kinds,
    family_shards_itself,
    family_stores_latent_kv,
    family_unknown_caches,
    mlx_lm_text_families,
)


class ModelKind(StrEnum):
    TEXT = "text"
    VLM = "vlm"
    AUDIO = "audio"


class WeightFormat(StrEnum):
    GGUF = "gguf"
    SAFETENSORS = "safetensors"


PIPELINE_STAGE_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""The families whose body `mlxcel_distributed.pipeline_stage` splits into stages."""


@dataclass(frozen=True)
class FamilyMetadata:
    """One model family as `config.json`'s `model_type` (or GGUF's architecture) names it.

    Attributes:
        model_type: the `model_type` / `general.architecture` value.
        kind: text, vision-language or audio.
        formats: weight formats mlxcel loads for this family.
        supports_adapters: LoRA adapters can be attached (to its linear layers).
        supports_tensor_parallel: its layers can be sharded across devices.
        supports_pipeline_parallel: its layers can be split into stages across devices.
        cache_kinds: what its layers may keep between tokens (a configuration picks some).
        unknown_caches: cache classes its layers may keep that the engine has no kind
            for, by name; a model that makes one is refused at load.
        batches_rows: rows of different contexts may share a forward pass; else the
            engine runs each row alone (`mlx_lm_families.ONE_CONTEXT_PER_PASS`).
        mlx_lm_module: the `mlx_lm.models` module that runs a text family; None otherwise.
        stores_latent_kv: its attention stores multi-head latent attention's compressed KV
            (one latent "head" per layer) instead of per-head keys and values.
    """

    model_type: str
    kind: ModelKind
    formats: frozenset[WeightFormat]
    supports_adapters: bool
    supports_tensor_parallel: bool = False
    supports_pipeline_parallel: bool = False
    cache_kinds: frozenset[CacheKind] = frozenset({CacheKind.ATTENTION})
    unknown_caches: frozenset[str] = frozenset()
    batches_rows: bool = True
    mlx_lm_module: str | None = None
    stores_latent_kv: bool = False

    @property
    def runs_in_engine(self) -> bool:
        """Whether the engine has a cache kind for everything its layers may keep."""
        return not self.unknown_caches

    @property
    def supports_paged_kv(self) -> bool:
        """Whether its attention layers keep their keys and values in the paged pool."""
        return self.runs_in_engine and any(kind.stores_kv for kind in self.cache_kinds)

    @property
    def supports_prefix_caching(self) -> bool:
        return self.runs_in_engine and prefix_caching_with(self.cache_kinds)

    @property
    def supports_speculative(self) -> bool:
        return self.runs_in_engine and speculative_decoding_with(self.cache_kinds)


_SAFETENSORS_ONLY = frozenset({WeightFormat.SAFETENSORS})

VISION_FAMILIES: dict[str, FamilyMetadata] = {
    name: FamilyMetadata(name, ModelKind.VLM, _SAFETENSORS_ONLY, False)
    for name in ("llava", "llava_next", "qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm")
}
"""The vision-language families mlxcel-vision loads."""


def _text_family(model_type: str, module: str) -> FamilyMetadata:
    kinds = family_cache_kinds(module)
    unknown = family_unknown_caches(module)
    formats = set(_SAFETENSORS_ONLY)
    if model_type in gguf_model_types():
        formats.add(WeightFormat.GGUF)
    return FamilyMetadata(
        model_type,
        ModelKind.TEXT,
        frozenset(formats),
        supports_adapters=not unknown,
        supports_tensor_parallel=not unknown and family_shards_itself(module),
        supports_pipeline_parallel=not unknown
        and model_type in PIPELINE_STAGE_FAMILIES
        and pipeline_stages_with(kinds),
        cache_kinds=kinds,
        unknown_caches=unknown,
        batches_rows=module not in ONE_CONTEXT_PER_PASS,
        mlx_lm_module=module,
        stores_latent_kv=family_stores_latent_kv(module),
    )


@functools.cache
def find_family(model_type: str) -> FamilyMetadata | None:
    """The family of `model_type`, or None when neither mlx-lm nor mlxcel-vision has it."""
    if model_type in VISION_FAMILIES:
        return VISION_FAMILIES[model_type]
    module = mlx_lm_text_families().get(model_type)
    return None if module is None else _text_family(model_type, module)


def all_families() -> dict[str, FamilyMetadata]:
    """Every family mlxcel knows, by model type, sorted."""
    names = sorted({*mlx_lm_text_families(), *VISION_FAMILIES})
    families = {name: find_family(name) for name in names}
    return {name: family for name, family in families.items() if family is not None}


def family_for(model_type: str, weight_format: WeightFormat) -> FamilyMetadata:
    """The family metadata for `model_type` in `weight_format`.

    Raises:
        ModelLoadError: the type is unknown or not loadable from this format; for a GGUF
            file the message lists the GGUF architecture names mlxcel loads.
    """
    family = find_family(model_type)
    if weight_format is WeightFormat.GGUF and (
        family is None or weight_format not in family.formats
    ):
        # A GGUF file names its architecture as llama.cpp does (`general.architecture`).
        raise ModelLoadError(
            f"unsupported GGUF architecture '{model_type}'; supported: "
            f"{', '.join(sorted(GGUF_ARCHITECTURES))}"
        )
    if family is None or weight_format not in family.formats:
        supported = sorted(name for name, f in all_families().items() if weight_format in f.formats)
        listed = ", ".join(supported) if len(supported) <= 30 else f"{len(supported)} types"
        raise ModelLoadError(
            f"unsupported model type '{model_type}' for {weight_format.value} files; "
            f"supported: {listed} (`mlxcel arch` lists them)"
        )
    return family
