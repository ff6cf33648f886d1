"""Which of a repository's files make the model: a safetensors folder or one GGUF file."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatch

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.store.reference import ModelReference

# A safetensors model's files, after mlx-lm's own download patterns
# (mlx_lm.utils.DEFAULT_ALLOW_PATTERNS) without its Python files: mlxcel runs no code
# from a repository.
SAFETENSORS_PATTERNS = (
    "*.json",
    "model*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jinja",
)
# Without a `:QUANT` tag, the first of these a GGUF-only repository holds: Q4_K_M first, the
# file llama.cpp's `-hf` and Ollama pick by default; then the other 4-bit files, then more
# bits, then the float files.
DEFAULT_GGUF_QUANTS = (
    "Q4_K_M", "Q4_K_S", "Q4_0", "Q4_1", "Q5_K_M", "Q6_K", "Q8_0", "BF16", "F16", "F32",
)  # fmt: skip
_PROJECTOR_PREFIX = "mmproj"


@dataclass(frozen=True)
class FileSelection:
    """The files to fetch for a model, and what to load once they are there.

    Attributes:
        files: repository paths to download.
        gguf_file: the GGUF file to load, or None for a safetensors folder.
    """

    files: tuple[str, ...]
    gguf_file: str | None


def select_files(reference: ModelReference, files: Iterable[str]) -> FileSelection:
    """Pick the files of `reference` among a repository's (or a folder's) `files`.

    A `:QUANT` tag picks the GGUF file whose name carries that tag. Without one, a
    repository with config.json and `model*.safetensors` gives its safetensors folder;
    a GGUF-only repository gives its only GGUF file, or the first of
    `DEFAULT_GGUF_QUANTS` it holds.

    Raises:
        ModelLoadError: no file, or more than one, fits; the message lists the GGUF files.
    """
    files = sorted(files)
    ggufs = [f for f in files if f.lower().endswith(".gguf") and not _is_projector(f)]
    if reference.quant is not None:
        gguf = _one_gguf(reference, reference.quant, ggufs)
        return FileSelection((gguf,), gguf)
    top_level = [f for f in files if "/" not in f]
    weights = [f for f in top_level if fnmatch(f, "model*.safetensors")]
    if "config.json" in top_level and weights:
        chosen = tuple(f for f in top_level if any(fnmatch(f, p) for p in SAFETENSORS_PATTERNS))
        return FileSelection(chosen, None)
    if len(ggufs) == 1:
        return FileSelection((ggufs[0],), ggufs[0])
    for quant in DEFAULT_GGUF_QUANTS:
        if any(_has_quant_tag(f, quant) for f in ggufs):
            gguf = _one_gguf(reference, quant, ggufs)
            return FileSelection((gguf,), gguf)
    if ggufs:
        raise ModelLoadError(
            f"{reference} holds no GGUF file of a default type ({', '.join(DEFAULT_GGUF_QUANTS)}); "
            f"pick one with {reference.repo_id}:QUANT from: {', '.join(ggufs)}"
        )
    raise ModelLoadError(
        f"{reference} holds neither a safetensors model (config.json and model*.safetensors) "
        "nor GGUF files"
    )


def _one_gguf(reference: ModelReference, quant: str, ggufs: list[str]) -> str:
    matches = [f for f in ggufs if _has_quant_tag(f, quant)]
    if len(matches) == 1:
        return matches[0]
    available = ", ".join(ggufs) or "none"
    if not matches:
        raise ModelLoadError(
            f"{reference.repo_id} has no {quant} GGUF file; GGUF files: {available}"
        )
    raise ModelLoadError(
        f"{reference.repo_id} has several {quant} GGUF files ({', '.join(matches)}); "
        "split GGUF files are not supported"
    )


def _has_quant_tag(path: str, quant: str) -> bool:
    """`model.Q8_0.gguf` and `model-q8_0.gguf` carry Q8_0; `model-Q4_0_4_4.gguf` does not
    carry Q4_0."""
    stem = _basename(path)[: -len(".gguf")]
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", stem, re.I) is not None


def _is_projector(path: str) -> bool:
    """Vision projectors (`mmproj-*.gguf`) sit beside the language model's GGUF files."""
    return _basename(path).lower().startswith(_PROJECTOR_PREFIX)


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]
