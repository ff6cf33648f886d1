"""Reads a CTranslate2 `model.bin` (binary version 6) into numpy arrays.

The layout, from CTranslate2's `python/ctranslate2/specs/model_spec.py` (`_serialize`):
u32 version, string spec name, u32 spec revision, u32 variable count, then per variable a
string name, u8 rank, u32 dims, u8 dtype id, u32 byte count and the raw bytes; then u32
alias count and (alias, target) string pairs. Strings are u16 length (with the NUL) + UTF-8
+ NUL. Integers are little-endian.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from mlxcel_models.errors import ModelLoadError

# Ordered as CTranslate2's DataType enum (include/ctranslate2/types.h).
_DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16, None)  # None: bfloat16
SUPPORTED_VERSIONS = (5, 6)


class _Reader:
    def __init__(self, data: memoryview):
        self._data = data
        self.offset = 0

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack_from("<" + fmt, self._data, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("H")
        text = bytes(self._data[self.offset : self.offset + length - 1]).decode("utf-8")
        self.offset += length
        return text

    def take(self, num_bytes: int) -> memoryview:
        chunk = self._data[self.offset : self.offset + num_bytes]
        if len(chunk) != num_bytes:
            raise ModelLoadError("model.bin is truncated")
        self.offset += num_bytes
        return chunk


def read_model_bin(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """The spec name and variables of a CTranslate2 model file.

    Aliases resolve to their target's array. bfloat16 variables come back as float32.

    Raises:
        ModelLoadError: the file is missing, truncated or of an unknown version.
    """
    try:
        data = memoryview(path.read_bytes())
    except OSError as error:
        raise ModelLoadError(f"cannot read {path}: {error.strerror or error}") from None
    reader = _Reader(data)
    try:
        version = reader.unpack("I")
        if version not in SUPPORTED_VERSIONS:
            raise ModelLoadError(f"{path} is CTranslate2 binary version {version}; supported: 5, 6")
        spec_name = reader.string()
        reader.unpack("I")  # spec revision
        variables = {}
        for _ in range(reader.unpack("I")):
            name = reader.string()
            shape = tuple(reader.unpack("I") for _ in range(reader.unpack("B")))
            dtype_id = reader.unpack("B")
            raw = reader.take(reader.unpack("I"))
            variables[name] = _as_array(raw, dtype_id, shape, name)
        for _ in range(reader.unpack("I")):
            alias, target = reader.string(), reader.string()
            variables[alias] = variables[target]
    except struct.error:
        raise ModelLoadError(f"{path} is truncated or not a CTranslate2 model") from None
    return spec_name, variables


def _as_array(raw: memoryview, dtype_id: int, shape: tuple[int, ...], name: str) -> np.ndarray:
    if dtype_id >= len(_DTYPES):
        raise ModelLoadError(f"model.bin variable {name} has unknown dtype id {dtype_id}")
    dtype = _DTYPES[dtype_id]
    if dtype is None:  # bfloat16: the high half of a float32
        halves = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return halves.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)
