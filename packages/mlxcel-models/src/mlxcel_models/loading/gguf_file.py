"""Reading GGUF files: the header (metadata, tensor types, shapes and offsets) and each
tensor's raw blocks, memory-mapped so that a loader reads one tensor at a time.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from mlxcel_models.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

_SCALAR_FORMATS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor lies in a GGUF file and how it is stored.

    Attributes:
        name: llama.cpp's tensor name (`blk.0.attn_q.weight`).
        type_name: the ggml type ("Q4_K", "F32", ...; "type N" for a type ggml does not
            define).
        shape: the shape in elements, outermost axis first (the file stores ggml's
            innermost-first order; this is the reverse, as numpy and MLX index).
        offset: the byte offset of its data from the start of the file.
    """

    name: str
    type_name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def ggml_type(self) -> GGMLQuantizationType | None:
        """The type as the `gguf` package names it; None for an unknown type."""
        return GGMLQuantizationType.__members__.get(self.type_name)

    @property
    def num_bytes(self) -> int:
        """Bytes of its data (ggml stores each row as whole blocks)."""
        block_size, type_size = GGML_QUANT_SIZES[self.ggml_type]
        return math.prod(self.shape) // block_size * type_size


@dataclass(frozen=True)
class GGUFHeader:
    """The parts of a GGUF header mlxcel inspects before loading tensors.

    Attributes:
        version: GGUF format version (2 or 3).
        metadata: metadata values as plain Python values (str, int, float, bool); arrays
            as lists when read with `arrays=True`, else left out.
        tensors: tensor name to its type, shape and position, in file order.
    """

    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]

    @property
    def tensor_types(self) -> dict[str, str]:
        """Tensor name to ggml type name."""
        return {name: info.type_name for name, info in self.tensors.items()}

    @property
    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name to shape, outermost axis first."""
        return {name: info.shape for name, info in self.tensors.items()}


# Numeric arrays this short are per-layer hyperparameters (a hybrid's KV head counts), which
# detection and memory estimates need; longer ones are the tokenizer's scores and types.
_PER_LAYER_ARRAY_LIMIT = 4096


class _Cursor:
    def __init__(self, buffer: mmap.mmap, *, arrays: bool) -> None:
        self.buffer, self.position, self.arrays = buffer, 0, arrays

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
            return self.array()
        return self.unpack(_SCALAR_FORMATS[value_type])

    def array(self) -> list[Any] | None:
        element_type, count = self.unpack("<I"), self.unpack("<Q")
        if element_type in _SCALAR_FORMATS:
            fmt = _SCALAR_FORMATS[element_type]
            start, size = self.position, count * struct.calcsize(fmt)
            if start + size > len(self.buffer):
                raise ValueError(f"array of {count} elements runs past the end of the file")
            self.position += size
            if not self.arrays and count > _PER_LAYER_ARRAY_LIMIT:
                return None
            return np.frombuffer(self.buffer, np.dtype(fmt), count, start).tolist()
        if element_type == _STRING:
            return self.strings(count)
        values = [self.value(element_type) for _ in range(count)]
        return values if self.arrays else None

    def strings(self, count: int) -> list[str] | None:
        buffer, position, length_of = self.buffer, self.position, _LENGTH.unpack_from
        strings = []
        for _ in range(count):
            (length,) = length_of(buffer, position)
            position += 8
            if self.arrays:
                strings.append(buffer[position : position + length].decode("utf-8", "replace"))
            position += length
        if position > len(buffer):
            raise ValueError(f"array of {count} strings runs past the end of the file")
        self.position = position
        return strings if self.arrays else None


def read_gguf_header(path: str | Path, *, arrays: bool = False) -> GGUFHeader:
    """Parse a GGUF file's header without reading tensor data.

    Args:
        path: the GGUF file.
        arrays: also keep array metadata (the tokenizer's vocabulary, merges, scores);
            detection and memory estimates do without them. Numeric arrays of up to 4096
            values (per-layer hyperparameters) are kept either way.

    Raises:
        ModelLoadError: the file is not GGUF (v2/v3), its header is truncated or corrupt,
            or a tensor's data lies outside the file.
    """
    path = Path(path)
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != GGUF_MAGIC:
                raise ModelLoadError(f"{path} is not a GGUF file")
            cursor = _Cursor(buf, arrays=arrays)
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
            entries = []
            for _ in range(tensor_count):
                name = cursor.string()
                dims = [cursor.unpack("<Q") for _ in range(cursor.unpack("<I"))]
                type_id, offset = cursor.unpack("<I"), cursor.unpack("<Q")
                entries.append((name, tuple(reversed(dims)), type_id, offset))
            alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
            data_start = -(-cursor.position // alignment) * alignment
            tensors = {
                name: _tensor_info(name, shape, type_id, data_start + offset, len(buf))
                for name, shape, type_id, offset in entries
            }
    except (struct.error, KeyError, ValueError, OverflowError, OSError) as error:
        raise ModelLoadError(f"{path}: corrupt or truncated GGUF header ({error})") from error
    return GGUFHeader(version, metadata, tensors)


def _tensor_info(
    name: str, shape: tuple[int, ...], type_id: int, offset: int, file_size: int
) -> GGUFTensorInfo:
    try:
        type_name = GGMLQuantizationType(type_id).name
    except ValueError:
        type_name = f"type {type_id}"
    info = GGUFTensorInfo(name, type_name, shape, offset)
    if info.ggml_type is not None:
        block_size = GGML_QUANT_SIZES[info.ggml_type][0]
        if shape and shape[-1] % block_size:
            raise ValueError(
                f"tensor '{name}' has rows of {shape[-1]} values, not whole "
                f"{type_name} blocks of {block_size}"
            )
        if offset + info.num_bytes > file_size:
            raise ValueError(f"tensor '{name}' runs past the end of the file")
    return info


class GGUFTensorData:
    """The tensors of one GGUF file, read on demand from a memory map.

    Args:
        path: the GGUF file.
        header: its parsed header.
    """

    def __init__(self, path: Path, header: GGUFHeader) -> None:
        self._file = np.memmap(path, dtype=np.uint8, mode="r")
        self._header = header

    def blocks(self, name: str) -> np.ndarray:
        """The raw data of tensor `name`: (..., rows, bytes per row) uint8, one row per
        innermost row of the tensor, made of whole ggml blocks (a view into the file)."""
        info = self._header.tensors[name]
        block_size, type_size = GGML_QUANT_SIZES[info.ggml_type]
        data = self._file[info.offset : info.offset + info.num_bytes]
        return data.reshape(*info.shape[:-1], info.shape[-1] // block_size * type_size)
