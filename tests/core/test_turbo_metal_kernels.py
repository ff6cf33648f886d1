"""The Metal kernels, on any machine: their launches, recorded through a fake
`mx.fast.metal_kernel`, and their sources, read as far as text can be against what MLX
hands a Metal kernel (test_metal_sources_on_cpu.py runs them). On an Apple GPU, the
TurboQuant kernels against decode-then-attend and the plain encoder.
"""

from __future__ import annotations

import functools
import re
import struct

import mlx.core as mx
import numpy as np
import pytest
from kernel_caches import kernels_built_by
from turbo_factories import attend_from_storage, decode_batch, gather_then_attend, written_storage

from mlxcel_core.cache.paged import BatchRow, PagedBatch
from mlxcel_core.cache.paged.centering import first_block_means
from mlxcel_core.kernels import CUDA, METAL, turbo_encode
from mlxcel_core.kernels.paged_attention import (
    decode,
    paged_decode_attention_kernel,
    turbo,
    turbo_decode_attention_kernel,
)
from mlxcel_core.kernels.paged_attention.turbo import supports_turbo
from mlxcel_core.kernels.turbo_encode import FirstBlockCentering, turbo_encode_kernel

# The Metal kernels, called as their references are.
turbo_decode_attention_metal = functools.partial(turbo_decode_attention_kernel, backend=METAL)
turbo_encode_metal = functools.partial(turbo_encode_kernel, backend=METAL)
paged_decode_attention_metal = functools.partial(paged_decode_attention_kernel, backend=METAL)

# What the Metal compiler would not take: CUDA's intrinsics, built-in indices, qualifiers
# and math functions.
CUDA_ONLY = re.compile(
    r"__shfl\w*|__syncthreads|__syncwarp|\bblockIdx\b|\bthreadIdx\b|\bblockDim\b|\bgridDim\b"
    r"|__int_as_float|__float2half|__half\b|__device__|__shared__|__forceinline__|__popc"
    r"|\b(?:fmaxf|exp2f|rsqrtf|sqrtf|fabsf)\b|cuda::"
)
# The thread attributes MLX adds to a kernel's signature when its body names them.
MLX_ATTRIBUTES = (
    "thread_position_in_grid",
    "thread_position_in_threadgroup",
    "threadgroup_position_in_grid",
    "threadgroups_per_grid",
)
METAL_ADDRESS_SPACES = ("device", "constant", "thread", "threadgroup")


class RecordedKernel:
    """A kernel as `mx.fast.metal_kernel` was asked to build it. Each call is recorded with
    the outputs it returned: random arrays of the asked shapes and dtypes."""

    def __init__(self, fill: np.random.Generator, **definition) -> None:
        self.definition = definition
        self.calls: list[dict[str, object]] = []
        self.fill = fill

    def __call__(self, **launch) -> list[mx.array]:
        pairs = zip(launch["output_shapes"], launch["output_dtypes"], strict=True)
        outputs = [mx.array(self.fill.standard_normal(shape)).astype(dt) for shape, dt in pairs]
        self.calls.append({**launch, "returned": outputs})
        return outputs


@pytest.fixture
def built(monkeypatch):
    """The Metal kernels built while a test runs, by name."""
    kernels: dict[str, RecordedKernel] = {}
    fill = np.random.default_rng(0)

    def metal_kernel(**definition) -> RecordedKernel:
        kernels[definition["name"]] = RecordedKernel(fill, **definition)
        return kernels[definition["name"]]

    with kernels_built_by(monkeypatch, METAL, metal_kernel):
        yield kernels


def turbo_problem(lengths: list[int], *, block_size: int):
    storage, tables = written_storage(
        lengths,
        num_kv_heads=2,
        head_dim=64,
        block_size=block_size,
        key_type="turbo4",
        value_type="turbo3",
        dtype=mx.bfloat16,
        seed=5,
        device=mx.Device(mx.cpu),
    )
    return storage, decode_batch(tables, lengths, block_size)


@pytest.mark.parametrize("num_partitions", [1, 4])
def test_decode_launch_matches_what_the_source_reads(built, num_partitions):
    storage, batch = turbo_problem([40, 9], block_size=16)
    key_codec, _ = storage.codecs(0)
    queries = mx.array(np.random.default_rng(1).standard_normal((2, 8, 1, 64))).astype(mx.bfloat16)
    with mx.stream(mx.cpu):
        out = attend_from_storage(
            turbo_decode_attention_metal,
            storage,
            batch,
            queries,
            scale=0.125,
            num_partitions=num_partitions,
        )
    name = "mlxcel_turbo_paged_decode"
    attention = built[name if num_partitions == 1 else f"{name}_split"]
    (launch,) = attention.calls
    assert launch["grid"] == (2 * 128, 2, num_partitions)
    assert launch["threadgroup"] == (128, 1, 1)
    template = dict(launch["template"])
    assert template == {
        "T": mx.bfloat16,
        "G": 4,
        "D": 64,
        "BLOCK_SIZE": 16,
        "THREADS": 128,
        "LANE_ELEMENTS": 8,
        "KEY_BITS": 4,
        "VALUE_BITS": 3,
        "OUTLIERS": 1,
        "ANCHOR_BEGIN": 1,
        "SCALE_BITS": struct.unpack("<i", struct.pack("<f", 0.125))[0],
    }
    inputs = dict(zip(attention.definition["input_names"], launch["inputs"], strict=True))
    slots = storage.keys[0][0].shape[0]
    expected = {
        "queries": ((2, 8, 64), mx.bfloat16),
        "rotated_queries": ((2, 8, 64), mx.float32),
        "key_codes": ((slots, 2, 32), mx.uint8),
        "key_scales": ((slots, 2, 1), mx.float16),
        "key_positions": ((slots, 2, 1), mx.uint8),
        "key_outliers": ((slots, 2, 1), mx.float16),
        "value_codes": ((slots, 2, 24), mx.uint8),
        "value_scales": ((slots, 2, 1), mx.float16),
        "value_positions": ((slots, 2, 1), mx.uint8),
        "value_outliers": ((slots, 2, 1), mx.float16),
        "signs": ((64,), mx.float32),
        "key_levels": ((16,), mx.float32),
        "value_levels": ((8,), mx.float32),
        "block_tables": ((2, 3), mx.int32),
        "context_lengths": ((2,), mx.int32),
    }
    assert {name: (x.shape, x.dtype) for name, x in inputs.items()} == expected
    with mx.stream(mx.cpu):
        rotated = queries.reshape(2, 8, 64).astype(mx.float32) @ key_codec.rotation
    assert mx.allclose(inputs["rotated_queries"], rotated)
    if num_partitions == 1:
        assert launch["output_shapes"] == [(2, 8, 1, 64)]
        assert launch["output_dtypes"] == [mx.float32]
        (result,) = built[name].calls
    else:
        parts = (2, 8, num_partitions)
        assert launch["output_shapes"] == [(*parts, 64), parts, parts]
        assert launch["output_dtypes"] == [mx.float32] * 3
        (result,) = built[f"{name}_merge"].calls
        assert result["grid"] == (2 * 8 * 64, 1, 1)
        assert dict(result["template"]) == {"T": mx.float32, "D": 64}
        assert [x.shape for x in result["inputs"]] == [(*parts, 64), parts, parts]
    # The kernel's float32 output is in rotated coordinates; the caller gets it rotated back.
    (kernel_output,) = result["returned"]
    with mx.stream(mx.cpu):
        expected_out = (kernel_output @ key_codec.rotation.T).astype(mx.bfloat16)
    assert out.dtype == mx.bfloat16 and mx.array_equal(out, expected_out)


def encoder_problem(centered: bool, cache_type: str = "turbo3"):
    """Keys of rows [20, 3] written through a storage, the codebook of its key codec, the
    last position of each row to encode again, and the centering of those positions."""
    storage, tables = written_storage(
        [20, 3],
        num_kv_heads=2,
        head_dim=32,
        block_size=8,
        key_type=cache_type,
        value_type=cache_type,
        dtype=mx.float32,
        seed=6,
        device=mx.Device(mx.cpu),
    )
    key_codec, _ = storage.codecs(0)
    batch = PagedBatch(
        [BatchRow(table, n - 1, 1) for table, n in zip(tables, [20, 3], strict=True)], 8
    )
    vectors = mx.array(np.random.default_rng(7).standard_normal((2, 2, 32)), mx.float32)
    anchors = batch.anchors
    centering = FirstBlockCentering(
        tuple(storage.keys[0]), anchors.anchor_slots, anchors.write_rows, anchors.write_centered
    )
    return vectors, key_codec.codebook, centering if centered else None, storage


@pytest.mark.parametrize("centered", [False, True])
def test_encoder_launch_matches_what_the_source_reads(built, centered):
    vectors, codebook, centering, storage = encoder_problem(centered)
    with mx.stream(mx.cpu):
        parts = turbo_encode_metal(vectors, codebook, centering)
    kernel = built["mlxcel_turbo_encode_centered" if centered else "mlxcel_turbo_encode"]
    (launch,) = kernel.calls
    assert launch["grid"] == (2 * 2 * 32, 1, 1) and launch["threadgroup"] == (32, 1, 1)
    assert dict(launch["template"]) == {"D": 32, "BITS": 3, "OUTLIERS": 1, "P": mx.uint8}
    inputs = dict(zip(kernel.definition["input_names"], launch["inputs"], strict=True))
    expected = {
        "vectors": ((2, 2, 32), mx.float32),
        "signs": ((32,), mx.float32),
        "boundaries": ((7,), mx.float32),
        "levels": ((8,), mx.float32),
    }
    if centered:
        slots = storage.keys[0][0].shape[0]
        expected |= {
            "pool_codes": ((slots, 2, 12), mx.uint8),
            "pool_scales": ((slots, 2, 1), mx.float16),
            "pool_positions": ((slots, 2, 1), mx.uint8),
            "pool_outliers": ((slots, 2, 1), mx.float16),
            "anchor_slots": ((2, 7), mx.int32),
            "write_rows": ((2,), mx.int32),
            "write_centered": ((2,), mx.bool_),
        }
        assert inputs["write_centered"].tolist() == [True, False]
    assert {name: (x.shape, x.dtype) for name, x in inputs.items()} == expected
    shapes = [(2, 2, 12), (2, 2, 1), (2, 2, 1), (2, 2, 1)]
    dtypes = [mx.uint8, mx.float16, mx.uint8, mx.float16]
    assert launch["output_shapes"] == shapes and launch["output_dtypes"] == dtypes
    assert all(a is b for a, b in zip(parts, launch["returned"], strict=True))


def all_kernels(built) -> dict[str, RecordedKernel]:
    """Every Metal kernel of the paged decode modules and the encoder, built."""
    for module in (decode, turbo, turbo_encode):
        module.kernels(METAL)
    return built


def identifiers(text: str) -> set[str]:
    """The names a kernel's code spells, its comments left out."""
    return set(re.findall(r"[A-Za-z_]\w*", re.sub(r"//.*", "", text)))


KERNELS = [
    "mlxcel_paged_decode",
    "mlxcel_paged_decode_split",
    "mlxcel_paged_decode_merge",
    "mlxcel_turbo_paged_decode",
    "mlxcel_turbo_paged_decode_split",
    "mlxcel_turbo_paged_decode_merge",
    "mlxcel_turbo_encode",
    "mlxcel_turbo_encode_centered",
]


@pytest.mark.parametrize("name", KERNELS)
def test_source_names_only_what_mlx_passes_and_metal_knows(built, name):
    definition = all_kernels(built)[name].definition
    source, header = definition["source"], definition.get("header", "")
    names = identifiers(source)
    assert set(definition["input_names"]) <= names, "an input the source never reads"
    assert set(definition["output_names"]) <= names, "an output the source never writes"
    # MLX passes `x_shape` for an input x whose name the body spells so.
    assert {m for m in re.findall(r"(\w+)_shape\b", source)} <= set(definition["input_names"])
    # Thread attributes and shapes reach the kernel's signature only from its body.
    assert not identifiers(header) & {*MLX_ATTRIBUTES, *(f"{n}_shape" for n in names)}
    assert not CUDA_ONLY.search(source + header)
    assert "[&]" not in source + header, "Metal has no lambdas"
    declared = re.findall(r"\b(?:int|float|bool|size_t|uint)\s+(\w+)\s*[=;\[]", source + header)
    assert not set(declared) & set(METAL_ADDRESS_SPACES), "a variable named as an address space"
    for text in (source, header):
        assert text.count("{") == text.count("}") and text.count("(") == text.count(")")
    assert "$" not in source + header, "a placeholder left unspelled"


@pytest.mark.parametrize("name", KERNELS)
def test_template_values_passed_are_those_the_source_uses(built, name):
    kernels = all_kernels(built)
    storage, batch = turbo_problem([40, 9], block_size=16)
    vectors, codebook, centering, _ = encoder_problem(True)
    with mx.stream(mx.cpu):
        for num_partitions in (1, 2):
            attend_from_storage(
                turbo_decode_attention_metal,
                storage,
                batch,
                mx.zeros((2, 8, 1, 64), mx.bfloat16),
                scale=0.125,
                num_partitions=num_partitions,
            )
            paged_decode_attention_metal(
                mx.zeros((2, 8, 1, 64), mx.bfloat16),
                mx.zeros((64, 2, 64), mx.bfloat16),
                mx.zeros((64, 2, 64), mx.bfloat16),
                batch.block_tables,
                batch.context_lengths,
                block_size=16,
                scale=0.125,
                num_partitions=num_partitions,
            )
        turbo_encode_metal(vectors, codebook, None)
        turbo_encode_metal(vectors, codebook, centering)
    kernel = kernels[name]
    launch = kernel.calls[0]
    text = kernel.definition["source"] + kernel.definition.get("header", "")
    passed = {key for key, _ in launch["template"]}
    # T types inputs and outputs in MLX's generated signature, so the body need not name it.
    assert passed - {"T"} <= identifiers(text)
    # Constants are spelled in capitals: each is passed, or declared in the kernel.
    constants = {name for name in identifiers(text) if re.fullmatch(r"[A-Z][A-Z0-9_]*", name)}
    declared = set(re.findall(r"constexpr int (\w+)", text))
    for params in re.findall(r"template <([^>]*)>", text):
        declared |= set(re.findall(r"(?:int|typename) (\w+)", params))
    assert constants - declared - {"INFINITY"} <= passed


def test_metal_takes_fewer_group_sizes_than_cuda_within_its_threadgroup_memory():
    assert supports_turbo(METAL, 4, 128, 128, 4, 4)
    assert supports_turbo(METAL, 4, 64, 64, 4, 3)
    for group_size, head_dim in [(8, 128), (8, 64)]:
        assert supports_turbo(CUDA, group_size, head_dim, head_dim, 4, 4)
        assert not supports_turbo(METAL, group_size, head_dim, head_dim, 4, 4)
    assert not supports_turbo(METAL, 4, 128, 64, 4, 4)


on_metal = pytest.mark.skipif(not mx.metal.is_available(), reason="needs an Apple GPU")


@on_metal
@pytest.mark.parametrize(("key_type", "value_type"), [("turbo4", "turbo4"), ("turbo3", "turbo2")])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("num_partitions", [1, 3, 16])
@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "head_dim", "block_size"),
    [(8, 2, 64, 16), (4, 4, 128, 8), (3, 1, 32, 1)],
)
def test_metal_kernel_matches_decoding_then_attending(
    key_type, value_type, dtype, num_partitions, num_q_heads, num_kv_heads, head_dim, block_size
):
    storage, tables = written_storage(
        [700, 1, 33, 257, 16],
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        key_type=key_type,
        value_type=value_type,
        dtype=dtype,
        seed=head_dim + block_size,
    )
    batch = decode_batch(tables, [700, 1, 33, 257, 16], block_size)
    queries = mx.array(
        np.random.default_rng(7).standard_normal((5, num_q_heads, 1, head_dim)),
        mx.float32,
    ).astype(dtype)
    scale = head_dim**-0.5
    out = attend_from_storage(
        turbo_decode_attention_metal,
        storage,
        batch,
        queries,
        scale=scale,
        num_partitions=num_partitions,
    )
    expected = gather_then_attend(storage, batch, queries, scale)
    assert out.shape == expected.shape and out.dtype == dtype
    difference = (out.astype(mx.float32) - expected.astype(mx.float32)).abs().max().item()
    assert difference <= {mx.float32: 1e-3, mx.bfloat16: 2e-2}[dtype] * expected.abs().max().item()


@on_metal
@pytest.mark.parametrize("cache_type", ["turbo2", "turbo3", "turbo4"])
@pytest.mark.parametrize("centered", [False, True])
def test_metal_encoder_stores_what_the_plain_encoder_does(cache_type, centered):
    vectors, codebook, centering, storage = encoder_problem(centered, cache_type)
    key_codec, _ = storage.codecs(0)
    with mx.stream(mx.gpu):
        kernel_parts = turbo_encode_metal(vectors, codebook, centering)
        mx.eval(kernel_parts)
    with mx.stream(mx.cpu):
        shifted = vectors
        if centering is not None:
            means = first_block_means(storage.keys[0], key_codec, centering.anchor_slots)
            means = means[centering.write_rows]
            shifted = vectors - mx.where(centering.write_centered[:, None, None], means, 0.0)
        plain_parts = key_codec.encode(shifted)
        same = mx.mean(kernel_parts[0] == plain_parts[0]).item()
        assert same > 0.99, f"{same:.4f} of code bytes agree"
        error = mx.linalg.norm(
            key_codec.decode(kernel_parts, mx.float32) - key_codec.decode(plain_parts, mx.float32)
        ) / mx.linalg.norm(shifted)
    assert error.item() < 1e-3
