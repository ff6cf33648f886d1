"""Loading the model a command names (a path or a Hugging Face id, fetched into the model
store first), with a progress bar for slow loads."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from tqdm import tqdm

from mlxcel.common.blas import loaded_openblas
from mlxcel_core.kernels.cpu_matvec import dense, describe_cpu_kernels
from mlxcel_core.kernels.cpu_matvec.dense import describe_cpu_dense_products
from mlxcel_core.kernels.dense_linear import KERNEL_MIN_ROWS
from mlxcel_models.attach_lora import apply_adapters
from mlxcel_models.backend import GGUFDequant, LoadProgress, select_backend
from mlxcel_models.compute import ComputeOptions, CpuBlas
from mlxcel_models.cpu_mlp import KERNEL_MIN_ELEMENTS, KernelSwiGLU
from mlxcel_models.default_model import default_model_path
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.lora import AdapterSpec
from mlxcel_models.metadata import ModelKind
from mlxcel_models.store import StoreConfig, resolve_model
from mlxcel_models.surgery import SurgeryPlan

PROGRESS_DELAY_SECONDS = 1.0


def load_for_command(
    model: str | None,
    *,
    store: StoreConfig,
    revision: str | None = None,
    compute: ComputeOptions | None = None,
    adapters: Sequence[AdapterSpec] = (),
    fuse_adapters: bool = False,
    surgery: SurgeryPlan | None = None,
    gguf_dequant: GGUFDequant = GGUFDequant.AUTO,
) -> LoadedModel:
    """Load `model` (or the default model) through the selected backend, showing progress
    on stderr after a second when stderr is a terminal, and the `surgery` edits applied,
    one line each, then attach its LoRA `adapters` (fused into the weights with
    `fuse_adapters`). `gguf_dequant` says
    how a GGUF file's quantized tensors load.

    A Hugging Face id in `model` is resolved through `store` at `revision` first (found in
    the store or the Hugging Face cache, else downloaded with huggingface_hub's progress
    bars on stderr). `compute` is passed to `load_model` (None: the best for the device).
    A vision-language model is loaded by mlxcel-vision.

    Raises:
        ModelLoadError: as `load_model` does, or the id cannot be fetched, or a
            vision-language model without the vision extra installed;
            `AdapterLoadError` for a bad adapter, `SurgeryError` for surgery that does not
            fit the model.
    """
    path = default_model_path() if model is None else resolve_model(model, store, revision=revision)
    # On a terminal only: in a log file the bar's redrawn frames would pile up.
    with tqdm(
        desc="loading",
        unit="layer",
        delay=PROGRESS_DELAY_SECONDS,
        file=sys.stderr,
        leave=False,
        disable=not sys.stderr.isatty(),
    ) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        backend = select_backend()
        backend.register_kind_loader(ModelKind.VLM, _load_vision_model)
        loaded = backend.load_model(
            path, progress=progress, compute=compute, surgery=surgery, gguf_dequant=gguf_dequant
        )
    for edit in loaded.surgery:
        print(f"mlxcel: surgery {edit}", file=sys.stderr)
    return apply_adapters(loaded, adapters, fuse=fuse_adapters)


def _load_vision_model(
    path: str | Path,
    *,
    progress: LoadProgress | None = None,
    compute: ComputeOptions | None = None,
) -> LoadedModel:
    """mlxcel-vision's loader, imported only when a vision-language model is loaded."""
    try:
        from mlxcel_vision.loading import load_vision_model
    except ImportError as error:
        raise ModelLoadError(
            f"{path} is a vision-language model: install the vision extra "
            "(pip install 'mlxcel[vision]')"
        ) from error
    return load_vision_model(path, progress=progress, compute=compute)


def process_blas() -> CpuBlas:
    """The BLAS this process's CPU matrix products run on."""
    return CpuBlas.OPENBLAS if loaded_openblas() is not None else CpuBlas.REFERENCE


def compute_options(max_batch: int | None) -> ComputeOptions:
    """The device's compute options for a command that decodes at most `max_batch`
    sequences together (None: any number, as when the model is split over ranks), with
    this process's BLAS: on the CPU, whether quantized weights are made dense
    (`ComputeOptions.for_device`, docs/adr/0029)."""
    return ComputeOptions.for_device(mx.default_device(), max_batch=max_batch, blas=process_blas())


def describe_weights(loaded: LoadedModel) -> str:
    """How the loaded weights are held, for the stats on stderr: quantized as the file
    has them, or dense (and in which dtype); for a GGUF file, what each of its tensor
    types became in memory; on the CPU, the BLAS running the matrix products, for
    quantized or float32 weights what runs their decode products, and how many MLPs compute their
    activation with the CPU kernel (`mlxcel_models.cpu_mlp`)."""
    config = loaded.config
    if config.quantized:
        held = "quantized, as in the file"
    else:
        held = " ".join(("dense", *((config.float_dtype,) if config.float_dtype else ())))
    if loaded.gguf_conversions:
        forms = (
            conversion.held_as(quantized=config.quantized, float_dtype=config.float_dtype)
            for conversion in loaded.gguf_conversions
        )
        held += ": " + ", ".join(map(str, forms))
    if mx.default_device().type == mx.DeviceType.cpu:
        held += f"; matrix products on {process_blas()}"
        if config.quantized:
            held += f"; decode products on {describe_cpu_kernels()}"
        elif config.float_dtype == "float32":
            held += (
                f"; decode products of {KERNEL_MIN_ROWS}-{dense.MAX_ROWS} rows on "
                f"{describe_cpu_dense_products()}"
            )
        mlps = _kernel_swiglu_mlps(loaded.model)
        if mlps:
            held += (
                f"; the SwiGLU activation of {mlps} MLPs on mlxcel's kernel from "
                f"{KERNEL_MIN_ELEMENTS:,} values"
            )
    return f"weights: {held}"


def _kernel_swiglu_mlps(model: object) -> int:
    """How many MLPs of an mlx-lm network (an `MlxLmLanguageModel`'s `module`) take the CPU
    SwiGLU kernel; 0 for a model without one."""
    module = getattr(model, "module", None)
    if not isinstance(module, nn.Module):
        return 0
    return sum(isinstance(layer, KernelSwiGLU) for _, layer in module.named_modules())


def load_target_model(
    args: argparse.Namespace,
    adapters: Sequence[AdapterSpec],
    surgery: SurgeryPlan | None,
    compute: ComputeOptions,
) -> LoadedModel:
    """`load_for_command` for the model of resolved `-m`, store, `--revision`,
    `--lora-fuse` and `--gguf-dequant` flags, with its `adapters`, `surgery` and `compute`
    options (`compute_options`).

    Raises:
        ModelLoadError: as `load_for_command` does.
    """
    return load_for_command(
        args.model,
        store=args.model_store,
        revision=args.revision,
        compute=compute,
        adapters=adapters,
        fuse_adapters=args.lora_fuse,
        surgery=surgery,
        gguf_dequant=args.gguf_dequant,
    )
