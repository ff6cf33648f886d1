"""Reading GGUF files: the header (metadata and tensor types) and the tensors.

The header is parsed here because `mx.load` silently dequantizes tensor types that MLX
cannot keep quantized (K-quants, I-quants) to float16; mlxcel refuses those instead.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcel_models.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"

# ggml's `enum ggml_type` (ggml/include/ggml.h).
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip

# Types MLX loads without loss: floats as they are, Q4_0/Q4_1/Q8_0 as affine quantization.
SUPPORTED_TENSOR_TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"})

_SCALAR_FORMATS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    """The parts of a GGUF header mlxcel inspects before loading tensors.

    Attributes:
        version: GGUF format version (2 or 3).
        metadata: scalar and string metadata values; arrays are skipped.
        tensor_types: tensor name to ggml type name (for example "Q4_1").
        tensor_shapes: tensor name to its shape in elements, outermost axis first (the
            file stores ggml's innermost-first order; this is the reverse, as `mx.load`).
    """

    version: int
    metadata: dict[str, Any]
    tensor_types: dict[str, str]
    tensor_shapes: dict[str, tuple[int, ...]]


class _Cursor:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.position = buffer, 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buffer, self.position)
        self.position += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        raw = self.buffer[self.position : self.position + length]
        self.position += length
        return raw.decode("utf-8", errors="replace")

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            self.skip_array()
            return None
        return self.unpack(_SCALAR_FORMATS[value_type])

    def skip_array(self) -> None:
        element_type, count = self.unpack("<I"), self.unpack("<Q")
        if element_type in _SCALAR_FORMATS:
            self.position += count * struct.calcsize(_SCALAR_FORMATS[element_type])
            return
        for _ in range(count):
            self.value(element_type)


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Parse a GGUF file's header without reading tensor data.

    Raises:
        ModelLoadError: the file is not GGUF (v2/v3) or its header is truncated or corrupt.
    """
    path = Path(path)
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            cursor = _Cursor(buf)
            if buf[:4] != GGUF_MAGIC:
                raise ModelLoadError(f"{path} is not a GGUF file")
            cursor.position = 4
            version = cursor.unpack("<I")
            if version not in (2, 3):
                raise ModelLoadError(f"{path}: GGUF version {version} is not supported (2, 3)")
            tensor_count, kv_count = cursor.unpack("<Q"), cursor.unpack("<Q")
            metadata: dict[str, Any] = {}
            for _ in range(kv_count):
                key = cursor.string()
                value = cursor.value(cursor.unpack("<I"))
                if value is not None:
                    metadata[key] = value
            tensor_types: dict[str, str] = {}
            tensor_shapes: dict[str, tuple[int, ...]] = {}
            for _ in range(tensor_count):
                name = cursor.string()
                n_dims = cursor.unpack("<I")
                dims = [cursor.unpack("<Q") for _ in range(n_dims)]
                type_id = cursor.unpack("<I")
                cursor.position += 8
                tensor_types[name] = GGML_TYPE_NAMES.get(type_id, f"type {type_id}")
                tensor_shapes[name] = tuple(reversed(dims))
    except (struct.error, KeyError, ValueError, OverflowError, OSError) as error:
        raise ModelLoadError(f"{path}: corrupt or truncated GGUF header ({error})") from error
    return GGUFHeader(version, metadata, tensor_types, tensor_shapes)


def check_tensor_types(path: Path, header: GGUFHeader) -> None:
    """Refuse tensor types that MLX cannot load without dequantizing.

    Raises:
        ModelLoadError: naming the first unsupported type and a tensor that uses it.
    """
    for name, type_name in header.tensor_types.items():
        if type_name not in SUPPORTED_TENSOR_TYPES:
            raise ModelLoadError(
                f"{path}: tensor '{name}' uses quantization {type_name}, which mlxcel does not "
                f"load; supported: {', '.join(sorted(SUPPORTED_TENSOR_TYPES))}"
            )


@dataclass(frozen=True)
class GGUFContents:
    """Tensors and metadata of one GGUF file.

    Attributes:
        tensors: llama.cpp tensor names to arrays. Q4_0 / Q4_1 / Q8_0 tensors appear as
            MLX affine-quantized triples `name.weight` (uint32), `name.scales` and
            `name.biases` (float16), group size 32.
        metadata: GGUF key/value metadata as plain Python values (str, int, float, bool,
            lists of those).
    """

    tensors: dict[str, mx.array]
    metadata: dict[str, Any]


def _to_python(value: Any) -> Any:
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def read_gguf(path: str | Path) -> GGUFContents:
    """Load a GGUF file's tensors and metadata, refusing unsupported tensor types.

    Raises:
        ModelLoadError: the file is missing, not GGUF, corrupt, or holds a tensor type
            MLX cannot load without loss.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    check_tensor_types(path, read_gguf_header(path))
    try:
        tensors, metadata = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as error:
        raise ModelLoadError(f"cannot read GGUF file {path}: {error}") from error
    return GGUFContents(tensors, {key: _to_python(value) for key, value in metadata.items()})
