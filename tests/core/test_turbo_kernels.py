"""The TurboQuant kernels: the dispatch, and on a CUDA device, decode attention read
straight from the pools against decoding them, then attending, and the encoder against
the plain-MLX one.

The pools are written by `PagedKVStorage` itself, so keys past each row's first block are
stored centered, in blocks scattered in a shuffled order through the pool.
"""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np
import pytest
from turbo_factories import (
    attend_from_storage,
    decode_batch,
    gather_then_attend,
    written_storage,
)

from mlxcel_core.cache.paged import layer_cache as layer_cache_module
from mlxcel_core.cache.paged.layer_cache import PagedLayerCache
from mlxcel_core.kernels import CUDA
from mlxcel_core.kernels.paged_attention import (
    turbo,
    turbo_decode_attention_kernel,
    turbo_decode_kernel_backend,
)
from mlxcel_core.kernels.paged_attention.turbo import supports_turbo
from mlxcel_core.kernels.turbo_encode import turbo_encode_backend

turbo_decode_attention_cuda = functools.partial(turbo_decode_attention_kernel, backend=CUDA)

LENGTHS = [700, 1, 33, 257, 16]


def test_dispatch_takes_no_kernel_on_the_cpu():
    assert turbo_decode_kernel_backend(mx.Device(mx.cpu), 32, 8, 64, 64, 4, 4) is None
    assert turbo_encode_backend(mx.Device(mx.cpu), 64) is None


def test_kernel_takes_one_head_dim_tiled_by_code_runs_within_shared_memory():
    assert supports_turbo(CUDA, 4, 64, 64, 4, 4)
    assert supports_turbo(CUDA, 8, 128, 128, 4, 3)
    assert supports_turbo(CUDA, 1, 8, 8, 2, 2)
    assert not supports_turbo(CUDA, 4, 128, 64, 4, 4)
    assert not supports_turbo(CUDA, 4, 512, 512, 4, 4)
    assert not supports_turbo(CUDA, 32, 128, 128, 4, 4)


class FakeKernels:
    """Stands in for the compiled kernels: records each launch; the one-pass kernel and the
    merge return `rotated`, the split kernel zeros."""

    def __init__(self, rotated: mx.array) -> None:
        self.rotated = rotated
        self.launches: list[tuple[str, tuple[int, int, int], dict[str, object]]] = []

    def kernels(self, backend) -> dict[str, object]:
        return {name: self._launcher(name) for name in ("one_pass", "split", "merge")}

    def _launcher(self, name: str):
        def launch(*, grid, template, output_shapes, output_dtypes, **_):
            self.launches.append((name, grid, dict(template)))
            if name == "split":
                pairs = zip(output_shapes, output_dtypes, strict=True)
                return [mx.zeros(shape, dtype) for shape, dtype in pairs]
            assert output_shapes == [self.rotated.shape] and output_dtypes == [mx.float32]
            return [self.rotated]

        return launch


@pytest.mark.parametrize(
    ("num_partitions", "launched"), [(1, ["one_pass"]), (4, ["split", "merge"])]
)
def test_launch_rotates_the_kernels_output_back(monkeypatch, num_partitions, launched):
    storage, tables = written_storage(
        [40, 9],
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        key_type="turbo4",
        value_type="turbo3",
        dtype=mx.bfloat16,
        seed=3,
        device=mx.Device(mx.cpu),
    )
    batch = decode_batch(tables, [40, 9], 16)
    key_codec, _ = storage.codecs(0)
    rotated = mx.array(np.random.default_rng(4).standard_normal((2, 8, 1, 64)).astype(np.float32))
    fake = FakeKernels(rotated)
    monkeypatch.setattr(turbo, "kernels", fake.kernels)
    with mx.stream(mx.cpu):
        out = attend_from_storage(
            turbo_decode_attention_cuda,
            storage,
            batch,
            mx.zeros((2, 8, 1, 64), mx.bfloat16),
            scale=0.125,
            num_partitions=num_partitions,
        )
        expected = (rotated @ key_codec.rotation.T).astype(mx.bfloat16)
    assert [name for name, _, _ in fake.launches] == launched
    _, grid, template = fake.launches[0]
    assert grid == (2 * 128, 2, num_partitions)
    assert (template["KEY_BITS"], template["VALUE_BITS"], template["OUTLIERS"]) == (4, 3, 1)
    assert template["G"] == 4 and template["ANCHOR_BEGIN"] == 1
    assert out.dtype == mx.bfloat16 and mx.array_equal(out, expected)


on_cuda = pytest.mark.skipif(not mx.cuda.is_available(), reason="needs a CUDA GPU")
# Relative error against decode-then-attend, which rounds keys and values to the model's
# dtype and, in float32 on CUDA, decodes them through a TF32 matrix product.
TOLERANCE = {mx.float32: 1e-3, mx.bfloat16: 2e-2}


@on_cuda
@pytest.mark.parametrize(("key_type", "value_type"), [("turbo4", "turbo4"), ("turbo3", "turbo2")])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("num_partitions", [1, 3, 16])
@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "head_dim", "block_size"),
    [(8, 2, 64, 16), (4, 4, 128, 8), (3, 1, 32, 1)],
)
def test_kernel_matches_decoding_then_attending(
    key_type, value_type, dtype, num_partitions, num_q_heads, num_kv_heads, head_dim, block_size
):
    storage, tables = written_storage(
        LENGTHS,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        key_type=key_type,
        value_type=value_type,
        dtype=dtype,
        seed=head_dim + block_size,
    )
    batch = decode_batch(tables, LENGTHS, block_size)
    rng = np.random.default_rng(7)
    queries = mx.array(
        rng.standard_normal((len(LENGTHS), num_q_heads, 1, head_dim)).astype(np.float32)
    ).astype(dtype)
    scale = head_dim**-0.5
    out = attend_from_storage(
        turbo_decode_attention_cuda,
        storage,
        batch,
        queries,
        scale=scale,
        num_partitions=num_partitions,
    )
    expected = gather_then_attend(storage, batch, queries, scale)
    assert out.shape == expected.shape and out.dtype == dtype
    difference = (out.astype(mx.float32) - expected.astype(mx.float32)).abs().max().item()
    assert difference <= TOLERANCE[dtype] * expected.abs().max().item()


@on_cuda
@pytest.mark.parametrize("decode_kernel", [True, False])
def test_layer_cache_decodes_from_turbo_pools_as_the_gather_path_does(decode_kernel, monkeypatch):
    launches = []

    def counted(*args, **kwargs):
        launches.append(args[0].shape)
        return turbo_decode_attention_kernel(*args, **kwargs)

    monkeypatch.setattr(layer_cache_module, "turbo_decode_attention_kernel", counted)
    storage, tables = written_storage(
        LENGTHS,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        key_type="turbo4",
        value_type="turbo4",
        dtype=mx.float32,
        seed=1,
    )
    storage.decode_kernel = decode_kernel
    batch = decode_batch(tables, LENGTHS, 16)
    rng = np.random.default_rng(2)
    queries = mx.array(rng.standard_normal((5, 8, 1, 64)).astype(np.float32))
    # Each row's last position written again, as a decode pass writes its new one.
    new_keys, new_values = (
        mx.array(rng.standard_normal((5, 2, 1, 64)).astype(np.float32)) for _ in range(2)
    )
    cache = PagedLayerCache(storage, 0, batch)
    keys, values = cache.update_and_fetch(new_keys, new_values)
    out = cache.attention(queries, keys, values, scale=0.125, mask=batch.mask())
    expected = gather_then_attend(storage, batch, queries, 0.125)
    difference = (out - expected).abs().max().item()
    assert difference <= TOLERANCE[mx.float32] * expected.abs().max().item()
    assert launches == ([(5, 8, 1, 64)] if decode_kernel else [])


@on_cuda
@pytest.mark.parametrize("cache_type", ["turbo2", "turbo3", "turbo4"])
@pytest.mark.parametrize(("head_dim", "block_size"), [(64, 16), (128, 8), (8, 4), (256, 16)])
def test_encoder_kernel_stores_what_the_plain_encoder_does(cache_type, head_dim, block_size):
    written = {
        device: written_storage(
            LENGTHS,
            num_kv_heads=2,
            head_dim=head_dim,
            block_size=block_size,
            key_type=cache_type,
            value_type=cache_type,
            dtype=mx.float32,
            seed=head_dim,
            device=mx.Device(device),
        )
        for device in (mx.gpu, mx.cpu)
    }
    (kernel_storage, tables), (plain_storage, _) = written[mx.gpu], written[mx.cpu]
    batch = decode_batch(tables, LENGTHS, block_size)
    with mx.stream(mx.cpu):
        for layer_pools in ("keys", "values"):
            kernel_codes = getattr(kernel_storage, layer_pools)[0][0]
            plain_codes = getattr(plain_storage, layer_pools)[0][0]
            same = mx.mean(kernel_codes == plain_codes).item()
            assert same > 0.99, f"{layer_pools}: {same:.4f} of code bytes agree"
        # Positions past a row's end read the null block, where padding writes collide.
        inside = (mx.arange(batch.num_keys) < batch.context_lengths[:, None])[:, None, :, None]
        for kernel_part, plain_part in zip(
            kernel_storage.gather(0, batch.read_slots, batch.anchors),
            plain_storage.gather(0, batch.read_slots, batch.anchors),
            strict=True,
        ):
            difference = mx.where(inside, kernel_part - plain_part, 0.0)
            error = mx.linalg.norm(difference) / mx.linalg.norm(mx.where(inside, plain_part, 0.0))
            assert error.item() < 1e-3
