"""Read a Piper voice's weights out of its ONNX graph, under the PyTorch parameter names.

Piper exports VITS with `torch.onnx.export`, which keeps most parameters under their
PyTorch names (`enc_p...`, `dp...`, `flow...`, `dec...`) but constant-folds others:
weight-normalized convolutions of the flow's WaveNet layers become `onnx::Conv_NNNN`, the
phoneme embedding of a single-speaker voice is stored under the name `sid`, and the
duration predictor's first affine flow keeps `exp(-logs)` (or, from torch 2.13's exporter,
`-logs` feeding an `Exp` node) instead of `logs`. Those tensors are named here after the
node that consumes them, so the model sees one naming scheme; the phoneme and speaker
embeddings (`enc_p.emb`, `emb_g`) are always read through the `Gather` that looks them up.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mlxcel_audio.piper.errors import VoiceLoadError

_AFFINE_EXP = "dp.flows.0.Exp_output_0"


@dataclass(frozen=True)
class ConvSpec:
    """How the graph runs one convolution: stride, symmetric padding and dilation."""

    stride: int
    padding: int
    dilation: int


@dataclass(frozen=True)
class VoiceWeights:
    """Weights in PyTorch layout (convolutions `(out, in, k)`, transposed ones `(in, out, k)`),
    float32, and each convolution's spec keyed by its module path (`dec.ups.0`)."""

    tensors: dict[str, np.ndarray]
    convs: dict[str, ConvSpec]


def read_voice_weights(onnx_path: Path) -> VoiceWeights:
    """Read every initializer of a Piper ONNX voice and name it after its PyTorch parameter.

    Raises:
        VoiceLoadError: the file is missing or not an ONNX model.
    """
    try:
        model = onnx.load(str(onnx_path))
    except FileNotFoundError:
        raise VoiceLoadError(f"no voice file at {onnx_path}") from None
    except Exception as error:  # onnx raises protobuf's DecodeError, not a public type
        raise VoiceLoadError(f"{onnx_path} is not an ONNX model: {error}") from None
    graph = model.graph
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    tensors: dict[str, np.ndarray] = {}
    convs: dict[str, ConvSpec] = {}
    for node in graph.node:
        module = _module_path(node.name)
        if node.op_type in ("Conv", "ConvTranspose"):
            attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            convs[module] = ConvSpec(
                stride=attributes.get("strides", [1])[0],
                padding=attributes.get("pads", [0])[0],
                dilation=attributes.get("dilations", [1])[0],
            )
            for role, name in zip(("weight", "bias"), node.input[1:], strict=False):
                if name in initializers:
                    tensors[f"{module}.{role}"] = initializers[name]
        elif node.op_type == "Gather" and module in ("enc_p.emb", "emb_g"):
            tensors[f"{module}.weight"] = initializers[node.input[0]]
        elif node.op_type == "Exp" and module == "dp.flows.0" and node.input[0] in initializers:
            tensors["dp.flows.0.logs"] = -initializers[node.input[0]]
    for name, value in initializers.items():
        if name.startswith(("enc_p.", "dp.", "flow.", "dec.")):
            tensors.setdefault(name, value)
        elif name.lstrip("/").replace("/", ".") == _AFFINE_EXP:
            tensors["dp.flows.0.logs"] = -np.log(value)
    return VoiceWeights(tensors={k: v.astype(np.float32) for k, v in tensors.items()}, convs=convs)


def _module_path(node_name: str) -> str:
    """`/dec/resblocks.0/convs.1/Conv` -> `dec.resblocks.0.convs.1`."""
    return ".".join(node_name.strip("/").split("/")[:-1])
