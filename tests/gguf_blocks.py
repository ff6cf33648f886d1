"""GGUF tensor data of every ggml type mlxcel loads, for quantization tests.

gguf-py quantizes only some types (`gguf.quants.quantize`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
TQ1_0, TQ2_0, MXFP4, BF16); those are made from a known float tensor. The K-quants,
I-quants and NVFP4 it can only dequantize, so their blocks are crafted: random bytes for the
codes, grid indices and sub-block scales, with each float scale field set to a finite value
of a realistic size (1e-2 to 1e-3), so every code path of the dequantizer is exercised.
"""

from __future__ import annotations

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
QUANTIZABLE = ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4")
# Byte offsets of the float16 scale fields of each crafted type (ggml/src/ggml-common.h).
_HALF_SCALES = {
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.IQ2_XXS: (0,),
    Q.IQ2_XS: (0,),
    Q.IQ2_S: (0,),
    Q.IQ3_XXS: (0,),
    Q.IQ3_S: (0,),
    Q.IQ1_S: (0,),
    Q.IQ4_NL: (0,),
    Q.IQ4_XS: (0,),
}
CRAFTED = (*(qtype.name for qtype in _HALF_SCALES), "IQ1_M", "NVFP4")
ALL_TYPES = (*QUANTIZABLE, *CRAFTED)


def tensor_data(type_name: str, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """Raw ggml data, (rows, bytes per row) uint8, of a `shape` tensor of `type_name`:
    quantized from a Gaussian tensor where gguf-py can, crafted otherwise."""
    rng = np.random.default_rng(seed)
    qtype = Q[type_name]
    if type_name in QUANTIZABLE:
        values = rng.standard_normal(shape).astype(np.float32) * 0.05
        data = np.ascontiguousarray(gguf.quants.quantize(values, qtype))
        return data.view(np.uint8).reshape(shape[0], -1)
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rows, columns = shape
    blocks = rng.integers(0, 256, (rows, columns // block_size, type_size), dtype=np.uint8)
    scales = rng.uniform(1e-3, 1e-2, blocks.shape[:2]).astype(np.float16)
    if qtype is Q.IQ1_M:
        # The float16 scale is split over the top nibbles of the four uint16 sub-scales.
        sub = blocks[..., 48:56].copy().view(np.uint16)
        nibbles = [(scales.view(np.uint16) >> (4 * i)) & 0xF for i in range(4)]
        blocks[..., 48:56] = ((sub & 0x0FFF) | (np.stack(nibbles, -1) << 12)).view(np.uint8)
    elif qtype is Q.NVFP4:
        # Four unsigned E4M3 sub-block scales lead the block; keep them finite.
        blocks[..., :4] = rng.integers(0x20, 0x38, (*blocks.shape[:2], 4), dtype=np.uint8)
    else:
        for offset in _HALF_SCALES[qtype]:
            blocks[..., offset : offset + 2] = scales[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def dequantized(data: np.ndarray, type_name: str) -> np.ndarray:
    """gguf-py's float32 values of `tensor_data`."""
    return gguf.quants.dequantize(data, Q[type_name]).astype(np.float32)
