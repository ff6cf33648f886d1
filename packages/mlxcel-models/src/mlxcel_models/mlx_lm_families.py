"""The text families mlx-lm ships, read from its `mlx_lm/models/` sources (docs/adr/0025).

A module of `mlx_lm.models` is a family when it defines (or imports) both `Model` and
`ModelArgs`; mlx-lm loads a config.json's `model_type` with the module of that name after
its `MODEL_REMAPPING`, so each alias there is a family too. The modules that hold the
language half of a vision-language checkpoint are not text families (`VISION_LANGUAGE`).
The cache classes a family may use are read from the `make_cache` methods in its source, so
nothing here imports the 120-odd model modules (`mlxcel arch` lists them all at once).
"""

from __future__ import annotations

import functools
import pkgutil
import re
from pathlib import Path

import mlx_lm.models
from mlx_lm.models import cache as mlx_lm_cache
from mlx_lm.utils import MODEL_REMAPPING

from mlxcel_core.cache.layout import CacheKind
from mlxcel_models.cache_kinds import kind_of_cache_class

VISION_LANGUAGE = {
    "qwen2_vl": "Qwen2-VL; mlxcel-vision loads qwen2_vl and qwen2_5_vl with their images",
    "qwen3_vl": "the language model of a Qwen3-VL checkpoint",
    "qwen3_vl_moe": "the language model of a Qwen3-VL MoE checkpoint",
    "kimi_vl": "the language model of a Kimi-VL checkpoint",
    "lfm2-vl": "the language model of an LFM2-VL checkpoint",
    "pixtral": "the language model of a Pixtral checkpoint",
    "mistral3": "the language model of a Mistral 3 (Mistral Small 3.1+) vision checkpoint",
}
"""mlx-lm modules that run only the text half of a vision-language checkpoint, dropping
its vision tower: loading them as text would silently ignore a user's images."""

ONE_CONTEXT_PER_PASS = {
    "gemma2": "it attends by hand over grouped (B, H_kv, repeats, L, S) scores, which a "
    "batch's per-row (B, 1, L, S) mask does not broadcast against",
    "gpt_bigcode": "its learned position embeddings are indexed by the cache offset as "
    "one integer (np.arange)",
    "afm7": "its KV-reuse layers take their query positions from the context's length",
    "llama4": "it builds its chunked-attention mask from the first cache's offset as one integer",
    "phi3small": "its block-sparse layers attend over grouped (B, H_kv, repeats, L, S) scores "
    "and lay their blocks out from the keys' count, as if each row's queries were its last",
}
"""mlx-lm modules whose models assume one context per forward pass, with the reason: the
engine runs each of their rows as a pass of its own (`batches_rows`)."""

_MODELS_DIR = Path(mlx_lm.models.__file__).parent


def module_for(model_type: str) -> str:
    """The mlx-lm module that runs `model_type` (its `MODEL_REMAPPING` applied)."""
    return MODEL_REMAPPING.get(model_type, model_type)


_CLASS = re.compile(r"^class (\w+)\b", re.MULTILINE)
# `from . import a, b` or `from .x import (names)`, at the top level.
_RELATIVE_IMPORT = re.compile(r"^from \.(\w*) import (\([^)]*\)|[^\n]*)", re.MULTILINE)
_NAME = re.compile(r"\b\w+\b")


@functools.cache
def _source(module: str) -> str | None:
    path = _MODELS_DIR / f"{module}.py"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _relative_imports(source: str) -> list[tuple[str, set[str]]]:
    """(module, imported names) per top-level `from .module import ...`; module "" for
    `from . import ...`."""
    return [
        (match[1], set(_NAME.findall(match[2].split("#")[0])) - {"as"})
        for match in _RELATIVE_IMPORT.finditer(source)
    ]


def is_family_module(module: str) -> bool:
    """Whether `mlx_lm.models.<module>` defines a model family (`Model` and `ModelArgs`,
    defined or imported at the top level)."""
    source = _source(module)
    if source is None:
        return False
    names = set(_CLASS.findall(source))
    for _, imported in _relative_imports(source):
        names |= imported
    return {"Model", "ModelArgs"} <= names


@functools.cache
def mlx_lm_text_families() -> dict[str, str]:
    """Every text `model_type` mlx-lm loads, with the module that runs it, by name."""
    modules = {info.name for info in pkgutil.iter_modules([str(_MODELS_DIR)])}
    families = {
        name: name for name in modules if name not in VISION_LANGUAGE and is_family_module(name)
    }
    for alias, module in MODEL_REMAPPING.items():
        if module in families:
            families[alias] = module
    return dict(sorted(families.items()))


def _imported_model_modules(source: str) -> set[str]:
    """mlx-lm modules this one takes a model from: `from . import x` or `from .x import
    <...Model...>`."""
    modules = set()
    for module, names in _relative_imports(source):
        if not module:
            modules |= names
        elif any("Model" in name for name in names):
            modules.add(module)
    return modules


def _make_cache_bodies(source: str) -> list[str]:
    """The source of every `def make_cache` in a module, each up to its dedent."""
    lines = source.splitlines()
    bodies = []
    for start, line in enumerate(lines):
        stripped = line.lstrip()
        if not stripped.startswith("def make_cache("):
            continue
        indent = len(line) - len(stripped)
        end = start + 1
        while end < len(lines) and (
            not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
        ):
            end += 1
        bodies.append("\n".join(lines[start:end]))
    return bodies


@functools.cache
def family_cache_classes(module: str) -> frozenset[str]:
    """The cache classes a family's models may make, by name, from its `make_cache`
    methods (mlx-lm's default, a `KVCache` per layer, where it defines none): mlx-lm's
    own, and any class of its module named `...Cache`. `CacheList`, which only holds
    others, is left out.

    A module whose `make_cache` only hands on to another model's (a checkpoint's
    `language_model`), or that defines none but takes its model from another module,
    has that module's classes. A configuration picks some of them: a llama model has
    sliding-window layers only when its config asks for them.
    """
    source = _source(module)
    if source is None:
        return frozenset()
    local_classes = set(_CLASS.findall(source))
    classes: set[str] = set()
    for body in _make_cache_bodies(source):
        for name in set(_NAME.findall(body)):
            known = getattr(mlx_lm_cache, name, None)
            mlx_lms = isinstance(known, type) and known.__module__ == mlx_lm_cache.__name__
            if mlx_lms or (name in local_classes and name.endswith("Cache")):
                classes.add(name)
    classes.discard(mlx_lm_cache.CacheList.__name__)
    if not classes:
        for other in sorted(_imported_model_modules(source)):
            if other != module and is_family_module(other):
                classes |= family_cache_classes(other)
    return frozenset(classes or {mlx_lm_cache.KVCache.__name__})


def family_cache_kinds(module: str) -> frozenset[CacheKind]:
    """The engine cache kinds of the classes a family's models may make
    (`family_cache_classes`); a class with no kind is in `family_unknown_caches`."""
    kinds = (_kind_of_class_name(name) for name in family_cache_classes(module))
    return frozenset(kind for kind in kinds if kind is not None)


def family_unknown_caches(module: str) -> frozenset[str]:
    """The cache classes a family's models may make that have no engine cache kind."""
    return frozenset(
        name for name in family_cache_classes(module) if _kind_of_class_name(name) is None
    )


def _kind_of_class_name(name: str) -> CacheKind | None:
    cache_class = getattr(mlx_lm_cache, name, None)
    return kind_of_cache_class(cache_class) if isinstance(cache_class, type) else None


@functools.cache
def family_shards_itself(module: str) -> bool:
    """Whether the family's `Model` splits itself over a distributed group (mlx-lm's
    `shard(group)`, which tensor parallelism calls), defined in its module or in the
    module it takes its model from."""
    source = _source(module)
    if source is None:
        return False
    if "def shard(" in source:
        return True
    return any(
        other != module and family_shards_itself(other)
        for other in _imported_model_modules(source)
        if is_family_module(other)
    )


_LATENT_UPDATE = re.compile(r"update_and_fetch\(\s*kv_latent\b")


@functools.cache
def family_stores_latent_kv(module: str) -> bool:
    """Whether the family's attention stores multi-head latent attention's compressed KV
    (`update_and_fetch(kv_latent, k_pe)`: one latent "head" of kv_lora_rank features as
    the key and the RoPE part as the value) rather than per-head keys and values; as
    `family_shards_itself`, also from the module it takes its model from."""
    source = _source(module)
    if source is None:
        return False
    if _LATENT_UPDATE.search(source):
        return True
    return any(
        other != module and family_stores_latent_kv(other)
        for other in _imported_model_modules(source)
        if is_family_module(other)
    )
