"""Write a GGUF model as an mlx-lm folder holding the same tensors, for like-for-like runs.

mlx-lm and `mlx_lm.server` read Hugging Face / mlx-lm folders only. This writes the tensors
mlxcel loads from a GGUF file (the file's dtypes, quantized layers kept quantized) as
safetensors, a config.json with the per-layer quantization, and the tokenizer with its chat
template, so both runtimes serve bit-identical weights.

    uv run python benchmarks/export_mlx_lm.py /tmp/smollm2-mlx          # the embedded model
    uv run python benchmarks/export_mlx_lm.py /tmp/model-mlx -m model.gguf
    uv run python benchmarks/export_mlx_lm.py /tmp/draft-mlx --num-layers 8   # a draft model
    uv run python benchmarks/export_mlx_lm.py /tmp/smollm2-f32 --float32  # as mlxcel's CPU runs it

With `--num-layers N` only the first N decoder layers are kept (the final norm and LM head
stay): a truncated-layer copy that speculative decoding can use as a draft model. With
`--float32` every quantized layer is written dense in float32, the weights mlxcel computes
with on the CPU (docs/adr/0004), so that mlx-lm runs the same arithmetic.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import save_config, save_model

from mlxcel_models.compute import ComputeOptions
from mlxcel_models.default_model import default_model_path
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.loading.gguf_model import gguf_model_config
from mlxcel_models.loading.gguf_names import ROPE_FACTOR_TENSORS
from mlxcel_models.loading.loader import load_model
from mlxcel_models.metadata import WeightFormat


def quantization_config(module: nn.Module) -> dict[str, Any] | None:
    """mlx-lm's `quantization` entry for `module`: the most common setting as the default,
    every quantized layer that differs from it keyed by its module path.

    Returns:
        None if no layer is quantized.
    """
    settings = {
        path: {"group_size": layer.group_size, "bits": layer.bits, "mode": layer.mode}
        for path, layer in module.named_modules()
        if isinstance(layer, nn.QuantizedLinear | nn.QuantizedEmbedding)
    }
    if not settings:
        return None
    counts: dict[tuple[int, int, str], int] = {}
    for setting in settings.values():
        key = (setting["group_size"], setting["bits"], setting["mode"])
        counts[key] = counts.get(key, 0) + 1
    group_size, bits, mode = max(counts, key=lambda key: counts[key])
    default = {"group_size": group_size, "bits": bits, "mode": mode}
    overrides = {path: setting for path, setting in settings.items() if setting != default}
    return {**default, **dict(sorted(overrides.items()))}


def export_gguf(
    gguf_path: str | Path,
    folder: str | Path,
    *,
    num_layers: int | None = None,
    float32: bool = False,
) -> Path:
    """Write the GGUF model at `gguf_path` as an mlx-lm folder.

    Args:
        gguf_path: a GGUF file mlxcel can load.
        folder: the output folder, created if missing; files in it are overwritten.
        num_layers: keep only the first `num_layers` decoder layers; None keeps all.
        float32: write every layer dense in float32 (quantized ones dequantized).

    Returns:
        The output folder.

    Raises:
        ValueError: the file is not GGUF, holds llama.cpp RoPE frequency factors, which
            mlx-lm's config cannot express, or `num_layers` is not in [1, its layers].
        ModelLoadError: mlxcel cannot load the file.
    """
    compute = ComputeOptions()
    if float32:
        compute = ComputeOptions(float_dtype=mx.float32, dense_weights_max_bytes=2**62)
    loaded = load_model(gguf_path, compute=compute)
    if loaded.source.weight_format is not WeightFormat.GGUF:
        raise ValueError(f"gguf_path must be a GGUF file, got {gguf_path}")
    header = read_gguf_header(loaded.source.path, arrays=True)
    if ROPE_FACTOR_TENSORS & set(header.tensors):
        raise ValueError(f"{gguf_path}: RoPE frequency factors cannot be exported to mlx-lm")
    config = gguf_model_config(header, loaded.source.path)
    config["eos_token_id"] = sorted(loaded.tokenizer.eos_token_ids)
    module = loaded.model.module
    if num_layers is not None:
        if not 1 <= num_layers <= len(module.model.layers):
            raise ValueError(
                f"num_layers must be in [1, {len(module.model.layers)}], got {num_layers}"
            )
        module.model.layers = module.model.layers[:num_layers]
        config["num_hidden_layers"] = num_layers
    if (quantization := quantization_config(module)) is not None:
        config["quantization"] = quantization
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, module)
    save_config(config, out / "config.json")
    loaded.tokenizer.hf_tokenizer.save_pretrained(out)
    if loaded.tokenizer.hf_tokenizer.chat_template is not None:
        # transformers may write the template to chat_template.jinja; mlx-lm and older
        # transformers read it from tokenizer_config.json, so keep it there as well.
        tokenizer_config_path = out / "tokenizer_config.json"
        tokenizer_config = json.loads(tokenizer_config_path.read_text(encoding="utf-8"))
        tokenizer_config["chat_template"] = loaded.tokenizer.hf_tokenizer.chat_template
        tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="output folder")
    parser.add_argument("-m", "--model", default=None, help="GGUF file (default: embedded)")
    parser.add_argument(
        "--num-layers", type=int, default=None, help="keep only the first N decoder layers"
    )
    parser.add_argument("--float32", action="store_true", help="write every layer dense in float32")
    args = parser.parse_args(argv)
    out = export_gguf(
        args.model or default_model_path(),
        args.folder,
        num_layers=args.num_layers,
        float32=args.float32,
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
