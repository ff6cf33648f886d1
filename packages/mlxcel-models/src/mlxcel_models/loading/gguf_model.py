"""Building an mlx-lm model from a GGUF file, one tensor at a time.

The architecture table (`gguf_architectures`) gives the mlx-lm family and its config; the
model is built with its initial weights left unevaluated; each GGUF tensor is then named
(`gguf_names`), brought back to the Hugging Face layout (the Q/K row permutation, Gemma's
norm offset), converted to its MLX form (`gguf_quant`) and evaluated before the next is
read, so no more than one tensor's float values exist at a time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.switch_layers import SwitchLinear

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loaded import TypeConversion
from mlxcel_models.loading.gguf_architecture import GGUFArchitecture
from mlxcel_models.loading.gguf_architectures import GGUF_ARCHITECTURES
from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_file import GGUFHeader, GGUFTensorData
from mlxcel_models.loading.gguf_layouts import TensorJoin, unpermute_rope_rows
from mlxcel_models.loading.gguf_names import ROPE_FACTOR_TENSORS, gguf_name_map
from mlxcel_models.loading.gguf_quant import (
    GGUFDequant,
    TensorForm,
    convert_tensor,
    plan_tensor,
)
from mlxcel_models.mlx_lm_models import make_mlx_lm_model
from mlxcel_models.rope import FrequencyFactorRoPE

_QUANTIZABLE_LAYERS = (nn.Linear, nn.Embedding, SwitchLinear)


@dataclass(frozen=True)
class GGUFModel:
    """An mlx-lm model read from a GGUF file.

    Attributes:
        module: the mlx-lm `Model`, its weights evaluated.
        config: the Hugging Face-style config it was built from.
        conversions: per ggml type and MLX form, how many tensors took that path, most
            frequent first.
    """

    module: nn.Module
    config: dict[str, Any]
    conversions: tuple[TypeConversion, ...]


def gguf_architecture(header: GGUFHeader, where: str | Path) -> GGUFArchitecture:
    """The table entry of a file's `general.architecture`.

    Raises:
        ModelLoadError: the architecture is missing or not one mlxcel loads.
    """
    name = header.metadata.get("general.architecture")
    arch = GGUF_ARCHITECTURES.get(name) if isinstance(name, str) else None
    if arch is None:
        raise ModelLoadError(
            f"{where}: GGUF architecture {name!r} is not supported; supported: "
            f"{', '.join(sorted(GGUF_ARCHITECTURES))}"
        )
    return arch


def gguf_model_config(header: GGUFHeader, where: str | Path) -> dict[str, Any]:
    """The Hugging Face-style config of a GGUF file's model.

    Raises:
        ModelLoadError: an unsupported architecture, a missing hyperparameter, or counts
            that shape no model.
    """
    arch = gguf_architecture(header, where)
    meta = GGUFMetadata(header.metadata, set(header.tensors), arch.name, where=where)
    return arch.config(meta)


def load_gguf_model(
    path: Path, header: GGUFHeader, *, dequant: GGUFDequant = GGUFDequant.AUTO
) -> GGUFModel:
    """Build the mlx-lm model a GGUF file holds.

    Args:
        path: the GGUF file.
        header: its header (`read_gguf_header`).
        dequant: how quantized tensors load.

    Raises:
        ModelLoadError: an unsupported architecture or tensor type, a tensor without a
            counterpart in the mlx-lm model, or a tensor shape that does not fit it.
    """
    arch = gguf_architecture(header, path)
    config = gguf_model_config(header, path)
    data = GGUFTensorData(path, header)
    if "rope_factors_long.weight" in header.tensors:
        config["rope_scaling"] = (config.get("rope_scaling") or {}) | _longrope_scaling(data)
    module = make_mlx_lm_model(config, where=path)
    parameters = dict(tree_flatten(module.parameters()))
    layers = dict(module.named_modules())
    names = gguf_name_map(arch, list(parameters), config["num_hidden_layers"])
    weights: dict[str, mx.array] = {}
    quantized: dict[str, dict[str, Any]] = {}
    seen: Counter[tuple[str, str]] = Counter()
    joined: dict[int, dict[str, mx.array]] = {}
    # Multi-token-prediction layers (`nextn_predict_layers`) follow the decoder's.
    mtp_layers = range(config["num_hidden_layers"], header.metadata[f"{arch.name}.block_count"])
    for name, info in header.tensors.items():
        if name in ROPE_FACTOR_TENSORS:
            continue
        block, within = _layer_tensor(name)
        if block in mtp_layers or within in arch.dropped_tensors or name in arch.dropped_tensors:
            continue
        if arch.tensor_join is not None and within in arch.tensor_join.names:
            form = _plan(path, name, info.type_name, info.shape, False, dequant)
            seen[info.type_name, form.label] += 1
            layer = joined.setdefault(block, {})
            layer[within] = convert_tensor(data.blocks(name), info.type_name, form)["weight"]
            weights |= _join_layer(path, arch.tensor_join, block, joined, config, parameters)
            continue
        routed = arch.route_tensor(name, config) if arch.route_tensor is not None else None
        if routed is not None:
            if routed:
                layout = _routed_layout(path, name, info.shape, routed, parameters, layers)
                form = _plan(path, name, info.type_name, info.shape, layout[0], dequant)
                seen[info.type_name, form.label] += 1
                arrays = convert_tensor(data.blocks(name), info.type_name, form)
                _add_routed(routed, arrays, form, layout[1], weights, quantized)
            continue
        target = names.get(name)
        if target is None:
            raise ModelLoadError(
                f"{path}: GGUF tensor '{name}' has no counterpart in mlx-lm's "
                f"{config['model_type']} model"
            )
        expected = tuple(parameters[target].shape)
        if info.shape != expected and not _reshapes_to(arch, name, info.shape, expected):
            raise ModelLoadError(
                f"{path}: GGUF tensor '{name}' has shape {list(info.shape)}, mlx-lm's "
                f"{target} needs {list(expected)}"
            )
        layer_path, suffix = target.rsplit(".", 1)
        quantizable = suffix == "weight" and isinstance(layers.get(layer_path), _QUANTIZABLE_LAYERS)
        form = _plan(path, name, info.type_name, info.shape, quantizable, dequant)
        arrays = _restore_layout(
            arch, name, config, convert_tensor(data.blocks(name), info.type_name, form)
        )
        if info.shape != expected:
            arrays = {"weight": arrays["weight"].reshape(expected)}
        seen[info.type_name, form.label] += 1
        if form.is_quantized:
            quantized[layer_path] = form.quantization()
            weights |= {f"{layer_path}.{key}": value for key, value in arrays.items()}
        else:
            weights[target] = arrays["weight"]
    if joined:
        parts = ", ".join(f"blk.{block}: {', '.join(sorted(joined[block]))}" for block in joined)
        raise ModelLoadError(f"{path}: tensors lack the rest of their layer's parts ({parts})")
    if arch.metadata_weights is not None:
        meta = GGUFMetadata(header.metadata, set(header.tensors), arch.name, where=path)
        weights |= arch.metadata_weights(meta, config)
    _load_weights(module, weights, quantized)
    if "rope_freqs.weight" in header.tensors:
        factors = mx.array(data.blocks("rope_freqs.weight").view(np.float32))
        install = arch.install_rope_factors or install_rope_factors
        install(module, factors, config)
    conversions = tuple(
        TypeConversion(type_name, form, count) for (type_name, form), count in seen.most_common()
    )
    return GGUFModel(module, config, conversions)


def _layer_tensor(name: str) -> tuple[int | None, str]:
    """(layer index, name within the layer) of a `blk.N.…` tensor; (None, name) for the
    tensors outside the layers."""
    if not name.startswith("blk."):
        return None, name
    _, block, within = name.split(".", 2)
    return int(block), within


def _tensor_base(name: str) -> str:
    """A tensor's name without its layer and suffix: `attn_q` for `blk.0.attn_q.weight`,
    `ssm_a` for `blk.0.ssm_a` (which has none)."""
    for suffix in (".weight", ".bias"):
        name = name.removesuffix(suffix)
    return name.rsplit(".", 1)[-1]


def _reshapes_to(
    arch: GGUFArchitecture, name: str, shape: tuple[int, ...], expected: tuple[int, ...]
) -> bool:
    """Whether a tensor the converter squeezed or unsqueezed holds the parameter's values."""
    same_size = int(np.prod(shape)) == int(np.prod(expected))
    return _tensor_base(name) in arch.reshaped_tensors and same_size


def _routed_layout(
    path: Path,
    name: str,
    shape: tuple[int, ...],
    targets: tuple[str, ...],
    parameters: dict[str, mx.array],
    layers: dict[str, nn.Module],
) -> tuple[bool, bool]:
    """How a tensor `route_tensor` sends to `targets` holds them: (whether it can stay
    quantized, all targets being weights of quantizable layers; whether it stacks them on
    a leading axis rather than on its rows, axis -2).

    Raises:
        ModelLoadError: a target is not a parameter, or the shapes do not stack to it.
    """
    missing = [target for target in targets if target not in parameters]
    if missing:
        raise ModelLoadError(f"{path}: GGUF tensor '{name}' is routed to no parameter {missing}")
    shapes = {tuple(parameters[target].shape) for target in targets}
    part = next(iter(shapes))
    count = len(targets)
    stacked = len(targets) > 1 and shape == (count, *part)
    by_rows = len(part) >= 2 and shape == (*part[:-2], part[-2] * count, part[-1])
    if len(shapes) != 1 or not (shape == part if count == 1 else stacked or by_rows):
        raise ModelLoadError(
            f"{path}: GGUF tensor '{name}' has shape {list(shape)}, which does not stack "
            f"{', '.join(targets)} of shapes {sorted(map(list, shapes))}"
        )
    quantizable = all(
        suffix == "weight" and isinstance(layers.get(layer_path), _QUANTIZABLE_LAYERS)
        for layer_path, suffix in (target.rsplit(".", 1) for target in targets)
    )
    return quantizable, stacked


def _add_routed(
    targets: tuple[str, ...],
    arrays: dict[str, mx.array],
    form: TensorForm,
    stacked: bool,
    weights: dict[str, mx.array],
    quantized: dict[str, dict[str, Any]],
) -> None:
    """Give each of `targets` its part of a converted tensor (packed codes, scales and
    biases alike): its index on the leading axis where `stacked`, else an equal share of
    the rows (axis -2); into `weights`, and `quantized` when it stays packed."""
    if len(targets) == 1:
        parts = {key: [value] for key, value in arrays.items()}
    elif stacked:
        parts = {key: list(value) for key, value in arrays.items()}
    else:
        parts = {key: mx.split(value, len(targets), axis=-2) for key, value in arrays.items()}
    for index, target in enumerate(targets):
        if form.is_quantized:
            layer_path = target.rsplit(".", 1)[0]
            quantized[layer_path] = form.quantization()
            weights |= {f"{layer_path}.{key}": value[index] for key, value in parts.items()}
        else:
            weights[target] = parts["weight"][index]


def _plan(
    path: Path,
    name: str,
    type_name: str,
    shape: tuple[int, ...],
    quantizable: bool,
    dequant: GGUFDequant,
) -> TensorForm:
    try:
        return plan_tensor(type_name, shape, quantizable=quantizable, dequant=dequant)
    except ValueError as error:
        raise ModelLoadError(f"{path}: tensor '{name}': {error}") from error


def _join_layer(
    path: Path,
    join: TensorJoin,
    block: int,
    joined: dict[int, dict[str, mx.array]],
    config: dict[str, Any],
    parameters: dict[str, mx.array],
) -> dict[str, mx.array]:
    """A layer's joined parameters once its tensors are all read (they then leave
    `joined`), else nothing yet."""
    arrays = join.join(joined[block], config)
    if arrays is None:
        return {}
    del joined[block]
    weights = {}
    for key, value in arrays.items():
        target = f"{join.layers_path}.{block}.{key}"
        expected = parameters.get(target)
        if expected is None or tuple(value.shape) != tuple(expected.shape):
            needs = "no such parameter" if expected is None else list(expected.shape)
            raise ModelLoadError(
                f"{path}: blk.{block}'s tensors give {target} shape {list(value.shape)}; "
                f"mlx-lm's {config['model_type']} model: {needs}"
            )
        weights[target] = value
    return weights


def _load_weights(
    module: nn.Module, weights: dict[str, mx.array], quantized: dict[str, dict[str, Any]]
) -> None:
    nn.quantize(module, class_predicate=lambda layer_path, _: quantized.get(layer_path, False))
    module.load_weights(list(weights.items()), strict=True)


def _restore_layout(
    arch: GGUFArchitecture, name: str, config: dict[str, Any], arrays: dict[str, mx.array]
) -> dict[str, mx.array]:
    """Undo the converter's layout changes on one converted tensor."""
    base = _tensor_base(name)
    if arch.restore_tensor is not None:
        arrays = arch.restore_tensor(base, arrays, config)
    if arch.rope_permuted and base in ("attn_q", "attn_k"):
        heads = config["num_attention_heads" if base == "attn_q" else "num_key_value_heads"]
        return {key: unpermute_rope_rows(value, heads) for key, value in arrays.items()}
    if arch.norm_offset and base.endswith("norm") and name.endswith(".weight"):
        weight = arrays["weight"]
        return {"weight": (weight.astype(mx.float32) - arch.norm_offset).astype(weight.dtype)}
    return arrays


def _longrope_scaling(data: GGUFTensorData) -> dict[str, Any]:
    """LongRoPE factors (Phi-3, MiniCPM 3), which the converter moved from the config into
    tensors."""
    factors = {
        key: data.blocks(f"rope_factors_{key}.weight").view(np.float32).tolist()
        for key in ("long", "short")
    }
    return {"type": "longrope", "long_factor": factors["long"], "short_factor": factors["short"]}


def install_rope_factors(module: nn.Module, factors: mx.array, config: dict[str, Any]) -> None:
    """Give every attention layer a RoPE scaled by llama.cpp's per-frequency factors.

    Args:
        module: an mlx-lm llama-family model whose attention layers hold `rope`.
        factors: the GGUF `rope_freqs` tensor, (head_dim / 2,) float.
    """
    for layer in module.model.layers:
        layer.self_attn.rope = FrequencyFactorRoPE(
            config["head_dim"], config["rope_theta"], factors
        )
