"""Reading LoRA adapter folders: mlx-lm's and Hugging Face PEFT's layouts.

Both describe, per linear layer, a low-rank update y = W x + scale * B (A x):

- mlx-lm (`mlx_lm/tuner/lora.py`, `mlx_lm/tuner/utils.py`): `adapter_config.json` with
  `lora_parameters.scale`, and `adapters.safetensors` with `{module}.lora_a` of shape
  (in, r) and `{module}.lora_b` of shape (r, out), module paths as in mlx-lm's model.
- PEFT (`peft/tuners/lora`): `adapter_config.json` with `r`, `lora_alpha`, `use_rslora`,
  `rank_pattern`, `alpha_pattern`, and `adapter_model.safetensors` with
  `base_model.model.{module}.lora_A.weight` of shape (r, in) and `.lora_B.weight` of shape
  (out, r); scale = alpha / r, or alpha / sqrt(r) with rsLoRA (Kalajdzievski, 2023).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcel_models.lora.errors import AdapterLoadError

CONFIG_FILE = "adapter_config.json"
MLX_LM_WEIGHTS = "adapters.safetensors"
PEFT_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


class AdapterFormat(StrEnum):
    MLX_LM = "mlx-lm"
    PEFT = "peft"


@dataclass(frozen=True)
class LoraWeights:
    """One linear layer's update, in mlx-lm's layout: y += scale * (x @ a) @ b.

    Attributes:
        a: (in, r) down projection, as stored (any float dtype).
        b: (r, out) up projection.
        scale: the adapter's own scale for this layer (before any runtime scale).
        a_name: the file's name for the tensor `a` came from, for messages.
        b_name: the file's name for the tensor `b` came from.
    """

    a: mx.array
    b: mx.array
    scale: float
    a_name: str
    b_name: str


@dataclass(frozen=True)
class AdapterFile:
    """A parsed adapter folder.

    Attributes:
        path: the folder.
        format: which layout it uses.
        layers: module path (mlx-lm's naming, e.g. `model.layers.0.self_attn.q_proj`) to
            that layer's update.
    """

    path: Path
    format: AdapterFormat
    layers: Mapping[str, LoraWeights]


def read_adapter(path: str | Path) -> AdapterFile:
    """Read an mlx-lm or PEFT adapter folder; shapes are checked against each other only.

    Raises:
        AdapterLoadError: the folder or a file is missing or unreadable, the config is not
            a plain LoRA config, or a tensor is not a LoRA tensor or pairs badly; the
            message names the path or tensor.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise AdapterLoadError(f"LoRA adapter {folder}: no such folder")
    config = _read_config(folder)
    if (folder / MLX_LM_WEIGHTS).is_file():
        tensors = _read_tensors(folder / MLX_LM_WEIGHTS)
        layers = _mlx_lm_layers(folder, config, tensors)
        return AdapterFile(folder, AdapterFormat.MLX_LM, layers)
    if (folder / PEFT_WEIGHTS).is_file():
        tensors = _read_tensors(folder / PEFT_WEIGHTS)
        return AdapterFile(folder, AdapterFormat.PEFT, _peft_layers(folder, config, tensors))
    raise AdapterLoadError(
        f"LoRA adapter {folder}: holds neither {MLX_LM_WEIGHTS} (mlx-lm) nor {PEFT_WEIGHTS} (PEFT)"
    )


def _read_config(folder: Path) -> dict[str, Any]:
    file = folder / CONFIG_FILE
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise AdapterLoadError(f"LoRA adapter {folder}: no {CONFIG_FILE}") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AdapterLoadError(f"LoRA adapter {file}: cannot read it: {error}") from error
    if not isinstance(config, dict):
        raise AdapterLoadError(f"LoRA adapter {file}: expected a JSON object")
    return config


def _read_tensors(file: Path) -> dict[str, mx.array]:
    try:
        tensors = mx.load(str(file))
    # MLX reports an unreadable or corrupt safetensors file as a RuntimeError or ValueError.
    except (RuntimeError, ValueError, OSError) as error:
        raise AdapterLoadError(f"LoRA adapter {file}: cannot read it: {error}") from error
    if not isinstance(tensors, dict):
        raise AdapterLoadError(f"LoRA adapter {file}: not a safetensors file")
    return tensors


def _number(config: Mapping[str, Any], key: str, where: Path) -> float:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise AdapterLoadError(f"LoRA adapter {where}: '{key}' must be a number, got {value!r}")
    return float(value)


def _pairs(
    folder: Path, tensors: Mapping[str, mx.array], suffixes: tuple[str, str], prefix: str = ""
) -> dict[str, tuple[str, str]]:
    """Module path → (A tensor name, B tensor name); every tensor must belong to a pair."""
    if not tensors:
        raise AdapterLoadError(f"LoRA adapter {folder}: holds no tensors")
    found: dict[str, dict[int, str]] = {}
    for name in tensors:
        matched = [
            (i, name[len(prefix) : -len(s)])
            for i, s in enumerate(suffixes)
            if name.startswith(prefix) and name.endswith(s)
        ]
        if not matched:
            raise AdapterLoadError(
                f"LoRA adapter {folder}: tensor {name} is not a LoRA tensor "
                f"(expected {prefix}MODULE{suffixes[0]} or {prefix}MODULE{suffixes[1]})"
            )
        index, module = matched[0]
        found.setdefault(module, {})[index] = name
    pairs = {}
    for module, names in found.items():
        for index, suffix in enumerate(suffixes):
            if index not in names:
                raise AdapterLoadError(
                    f"LoRA adapter {folder}: tensor {prefix}{module}{suffix} is missing "
                    f"(its pair {names[1 - index]} is there)"
                )
        pairs[module] = (names[0], names[1])
    return pairs


def _check_pair(folder: Path, a: mx.array, b: mx.array, a_name: str, b_name: str) -> None:
    """Checks (in, r) and (r, out) matrices of the same rank."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise AdapterLoadError(
            f"LoRA adapter {folder}: tensors {a_name} {tuple(a.shape)} and {b_name} "
            f"{tuple(b.shape)} are not a rank-r pair"
        )


def _mlx_lm_layers(
    folder: Path, config: Mapping[str, Any], tensors: Mapping[str, mx.array]
) -> dict[str, LoraWeights]:
    fine_tune_type = config.get("fine_tune_type", "lora")
    if fine_tune_type != "lora":
        raise AdapterLoadError(
            f"LoRA adapter {folder}: fine_tune_type {fine_tune_type!r} is not supported "
            "(only 'lora')"
        )
    parameters = config.get("lora_parameters")
    if not isinstance(parameters, dict):
        raise AdapterLoadError(f"LoRA adapter {folder}: {CONFIG_FILE} has no 'lora_parameters'")
    scale = _number(parameters, "scale", folder)
    layers = {}
    for module, (a_name, b_name) in _pairs(folder, tensors, (".lora_a", ".lora_b")).items():
        a, b = tensors[a_name], tensors[b_name]
        _check_pair(folder, a, b, a_name, b_name)
        layers[module] = LoraWeights(a, b, scale, a_name, b_name)
    return layers


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """PEFT's per-module override: the first pattern matching the end of the module path."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?(?:{pattern})$", module):
            return value
    return default


def _peft_layers(
    folder: Path, config: Mapping[str, Any], tensors: Mapping[str, mx.array]
) -> dict[str, LoraWeights]:
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA" or config.get("use_dora"):
        kind = "DoRA" if config.get("use_dora") else repr(peft_type)
        raise AdapterLoadError(f"LoRA adapter {folder}: {kind} adapters are not supported")
    rank = _number(config, "r", folder)
    alpha = _number(config, "lora_alpha", folder)
    rank_pattern = config.get("rank_pattern") or {}
    alpha_pattern = config.get("alpha_pattern") or {}
    suffixes = (".lora_A.weight", ".lora_B.weight")
    layers = {}
    for module, (a_name, b_name) in _pairs(folder, tensors, suffixes, _PEFT_PREFIX).items():
        a, b = tensors[a_name].T, tensors[b_name].T
        _check_pair(folder, a, b, a_name, b_name)
        module_rank = _pattern_value(rank_pattern, module, rank)
        if a.shape[1] != module_rank:
            raise AdapterLoadError(
                f"LoRA adapter {folder}: tensor {a_name} has rank {a.shape[1]}, but the config "
                f"gives {module} rank {module_rank:g}"
            )
        module_alpha = _pattern_value(alpha_pattern, module, alpha)
        divisor = math.sqrt(module_rank) if config.get("use_rslora") else module_rank
        layers[module] = LoraWeights(a, b, module_alpha / divisor, a_name, b_name)
    return layers
