"""Gumbel-max sampling: the Philox generator against Random123's known answers, the
plain-MLX reference against softmax(logits / T) by chi-square tests, the CUDA launch with a
faked `mx.fast.cuda_kernel`, the sampler's dispatch, and on a CUDA device the kernel
against the reference.

Runs with only mlx, numpy and the workspace's packages (`--noconftest`), so a GPU machine
needs nothing else to run it.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.kernels import CUDA, METAL, kernel_backend
from mlxcel_core.kernels.gumbel_sampling import (
    gumbel_max_sample_kernel,
    gumbel_max_sample_reference,
    philox4x32_10,
    token_uniforms,
)
from mlxcel_core.kernels.gumbel_sampling import kernel as kernel_module
from mlxcel_core.sampling import Sampler, SamplerStage, SamplingParams, sample_batch
from mlxcel_core.sampling import sampler as sampler_module

gumbel_max_sample_cuda = functools.partial(gumbel_max_sample_kernel, backend=CUDA)
gumbel_max_sample_metal = functools.partial(gumbel_max_sample_kernel, backend=METAL)

NEG_INF = float("-inf")
# Five finite tokens (a chi-square test of 4 degrees of freedom) and one removed.
SMALL_LOGITS = [2.0, 1.0, NEG_INF, 0.5, 0.0, -1.0]
SMALL_TEMPERATURE = 0.7
NUM_DRAWS = 20_000


def chi_square_p_value(statistic: float, degrees_of_freedom: int) -> float:
    """P(X >= statistic) for X chi-square distributed with an even number of degrees of
    freedom 2k: exp(-x/2) * sum_{i<k} (x/2)^i / i! (Abramowitz and Stegun 26.4.21)."""
    if degrees_of_freedom % 2:
        raise ValueError(f"degrees_of_freedom must be even, got {degrees_of_freedom}")
    half = statistic / 2
    return math.exp(-half) * sum(
        half**i / math.factorial(i) for i in range(degrees_of_freedom // 2)
    )


def goodness_of_fit(tokens: np.ndarray, logits: list[float], temperature: float) -> float:
    """The chi-square p-value of `tokens` drawn from softmax(logits / temperature), over
    the finite tokens; a removed token drawn fails at once."""
    logits_array = np.array(logits, dtype=np.float64)
    finite = np.isfinite(logits_array)
    counts = np.bincount(tokens, minlength=len(logits))
    if counts[~finite].any():
        return 0.0
    weights = np.exp((logits_array[finite] - logits_array[finite].max()) / temperature)
    expected = weights / weights.sum() * len(tokens)
    statistic = float(((counts[finite] - expected) ** 2 / expected).sum())
    return chi_square_p_value(statistic, int(finite.sum()) - 1)


def many_seeds(count: int, stream: int = 7) -> mx.array:
    """(count, 2) uint32 keys: one draw's seed per row."""
    return mx.stack(
        [mx.arange(count, dtype=mx.uint32), mx.full((count,), stream, dtype=mx.uint32)], axis=1
    )


def draw_small(sample, *, temperature: float = SMALL_TEMPERATURE) -> np.ndarray:
    """`NUM_DRAWS` draws of `sample` from SMALL_LOGITS, each row under its own seed."""
    logits = mx.broadcast_to(mx.array(SMALL_LOGITS), (NUM_DRAWS, len(SMALL_LOGITS)))
    temperatures = mx.full((NUM_DRAWS,), temperature, dtype=mx.float32)
    return np.array(sample(logits, temperatures, many_seeds(NUM_DRAWS)))


def uniforms_as_reference(logits: mx.array, seeds: mx.array) -> mx.array:
    return token_uniforms(seeds, logits.shape[1])


def exponential_noise(logits: mx.array, temperatures: mx.array, seeds: mx.array) -> mx.array:
    """A wrong draw: -log(u) in place of -log(-log(u))."""
    noise = -mx.log(uniforms_as_reference(logits, seeds))
    return mx.argmax(logits / temperatures[:, None] + noise, axis=-1)


def temperature_ignored(logits: mx.array, temperatures: mx.array, seeds: mx.array) -> mx.array:
    """A wrong draw: the Gumbel-max of the untempered logits."""
    return gumbel_max_sample_reference(logits, mx.ones_like(temperatures), seeds)


@pytest.mark.parametrize(
    ("counter", "key", "expected"),
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_gives_random123s_known_answers(counter, key, expected):
    words = philox4x32_10(
        tuple(mx.array([w], dtype=mx.uint32) for w in counter),
        tuple(mx.array([w], dtype=mx.uint32) for w in key),
    )
    assert tuple(word.item() for word in words) == expected


def test_uniforms_are_the_philox_words_of_each_group_of_four_tokens():
    seeds = mx.array([[3, 9]], dtype=mx.uint32)
    uniforms = np.array(token_uniforms(seeds, 6))
    group = mx.array([1], dtype=mx.uint32)
    zero = mx.zeros_like(group)
    key = (mx.array([3], dtype=mx.uint32), mx.array([9], dtype=mx.uint32))
    words = [word.item() for word in philox4x32_10((group, zero, zero, zero), key)]
    assert uniforms.shape == (1, 6) and uniforms.dtype == np.float32
    assert uniforms[0, 4:].tolist() == [((w >> 8) | 1) * 2.0**-24 for w in words[:2]]
    assert ((uniforms > 0) & (uniforms < 1)).all()


def test_reference_draws_follow_the_tempered_softmax():
    tokens = draw_small(gumbel_max_sample_reference)
    assert goodness_of_fit(tokens, SMALL_LOGITS, SMALL_TEMPERATURE) > 0.01


@pytest.mark.parametrize("wrong_draw", [exponential_noise, temperature_ignored])
def test_the_same_test_rejects_a_wrong_draw(wrong_draw):
    tokens = draw_small(wrong_draw)
    assert goodness_of_fit(tokens, SMALL_LOGITS, SMALL_TEMPERATURE) < 0.01


def test_removed_tokens_are_never_drawn_and_an_all_removed_row_draws_token_0():
    logits = mx.array(
        [[NEG_INF, NEG_INF, 5.0, NEG_INF], [NEG_INF] * 4, [-30.0, NEG_INF, NEG_INF, -31.0]]
    )
    logits = mx.repeat(logits, 500, axis=0)
    temperatures = mx.full((logits.shape[0],), 2.0, dtype=mx.float32)
    tokens = np.array(gumbel_max_sample_reference(logits, temperatures, many_seeds(1500)))
    assert set(tokens[:500]) == {2}
    assert set(tokens[500:1000]) == {0}
    assert set(tokens[1000:]) == {0, 3}


def test_same_seeds_give_the_same_tokens_and_other_seeds_others():
    rng = np.random.default_rng(0)
    logits = mx.array(rng.standard_normal((16, 1000)).astype(np.float32))
    temperatures = mx.ones((16,), dtype=mx.float32)
    first = gumbel_max_sample_reference(logits, temperatures, many_seeds(16))
    again = gumbel_max_sample_reference(logits, temperatures, many_seeds(16))
    other = gumbel_max_sample_reference(logits, temperatures, many_seeds(16, stream=8))
    assert mx.array_equal(first, again)
    assert (np.array(first) != np.array(other)).sum() >= 12


def test_a_rows_token_depends_only_on_its_own_row():
    rng = np.random.default_rng(1)
    logits = mx.array(rng.standard_normal((5, 300)).astype(np.float32))
    temperatures = mx.array([0.5, 1.0, 1.5, 2.0, 0.9])
    seeds = many_seeds(5)
    together = gumbel_max_sample_reference(logits, temperatures, seeds)
    alone = [
        gumbel_max_sample_reference(logits[b : b + 1], temperatures[b : b + 1], seeds[b : b + 1])
        for b in range(5)
    ]
    assert mx.array_equal(together, mx.concatenate(alone))


def test_rows_with_neighbouring_seeds_draw_independently():
    # Two rows of one draw, keys (i, 0) and (i, 1): their 3 x 3 contingency table of tokens
    # against independence, a chi-square test of 4 degrees of freedom.
    logits = mx.zeros((2 * NUM_DRAWS, 3))
    seeds = mx.stack(
        [
            mx.repeat(mx.arange(NUM_DRAWS, dtype=mx.uint32), 2),
            mx.tile(mx.array([0, 1], mx.uint32), NUM_DRAWS),
        ],
        axis=1,
    )
    tokens = np.array(gumbel_max_sample_reference(logits, mx.ones((2 * NUM_DRAWS,)), seeds))
    table = np.zeros((3, 3))
    np.add.at(table, (tokens[0::2], tokens[1::2]), 1)
    expected = np.outer(table.sum(1), table.sum(0)) / NUM_DRAWS
    statistic = float(((table - expected) ** 2 / expected).sum())
    assert chi_square_p_value(statistic, 4) > 0.01


@pytest.mark.parametrize(
    "sample", [gumbel_max_sample_reference, gumbel_max_sample_cuda, gumbel_max_sample_metal]
)
def test_arguments_are_checked(sample):
    logits = mx.zeros((2, 8))
    temperatures = mx.ones((2,))
    seeds = mx.zeros((2, 2), dtype=mx.uint32)
    with pytest.raises(ValueError, match=r"logits must be \(B, V\) float32"):
        sample(logits.astype(mx.int32), temperatures, seeds)
    with pytest.raises(ValueError, match=r"temperatures must be \(2,\) float32, got \(3,\)"):
        sample(logits, mx.ones((3,)), seeds)
    with pytest.raises(ValueError, match=r"seeds must be \(2, 2\) uint32, got \(2, 2\) .*int32"):
        sample(logits, temperatures, seeds.astype(mx.int32))


class FakeCudaKernel:
    """Stands in for `mx.fast.cuda_kernel`: records how the kernel is built and launched,
    and returns the reference's tokens."""

    def __init__(self) -> None:
        self.built: dict[str, object] = {}
        self.launches: list[dict[str, object]] = []

    def __call__(self, **definition):
        self.built = definition

        def launch(*, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
            self.launches.append(
                {
                    "inputs": inputs,
                    "template": dict(template),
                    "grid": grid,
                    "threadgroup": threadgroup,
                    "outputs": (output_shapes, output_dtypes),
                }
            )
            return [gumbel_max_sample_reference(*inputs)]

        return launch


def test_cuda_launch_takes_one_block_per_row(monkeypatch):
    fake = FakeCudaKernel()
    monkeypatch.setattr(mx.fast, "cuda_kernel", fake)
    kernel_module.kernel.cache_clear()
    logits = mx.array(np.random.default_rng(2).standard_normal((3, 50)).astype(np.float32))
    logits = logits.astype(mx.bfloat16)
    temperatures = mx.array([0.5, 1.0, 2.0])
    seeds = many_seeds(3)
    try:
        tokens = gumbel_max_sample_cuda(logits, temperatures, seeds)
    finally:
        kernel_module.kernel.cache_clear()
    assert fake.built["input_names"] == ["logits", "temperatures", "seeds"]
    assert fake.built["output_names"] == ["tokens"]
    (launch,) = fake.launches
    assert launch["grid"] == (3 * kernel_module.THREADS, 1, 1)
    assert launch["threadgroup"] == (kernel_module.THREADS, 1, 1)
    assert launch["template"] == {"T": mx.bfloat16, "THREADS": kernel_module.THREADS}
    inputs = launch["inputs"]
    assert inputs[0] is logits and inputs[1] is temperatures and inputs[2] is seeds
    assert launch["outputs"] == ([(3,)], [mx.int32])
    assert mx.array_equal(tokens, gumbel_max_sample_reference(logits, temperatures, seeds))


def test_the_cpu_keeps_the_categorical_draw(monkeypatch):
    assert kernel_backend(mx.Device(mx.cpu)) is None

    def no_kernel(*_, **__):
        raise AssertionError("the kernel ran on the CPU")

    monkeypatch.setattr(sampler_module, "gumbel_max_sample_kernel", no_kernel)
    logits = mx.array(np.random.default_rng(3).standard_normal((2, 40)).astype(np.float32))
    params = SamplingParams(temperature=0.8, seed=11)
    with mx.stream(mx.cpu):
        token = Sampler(params)(logits[0], mx.array([], dtype=mx.int32))
        batch = sample_batch([Sampler(params), Sampler(params)], logits)
        key = mx.random.split(mx.random.split(mx.random.key(11))[0])[1]
        expected = mx.random.categorical(logits[0] / 0.8, key=key)
    assert token.item() == expected.item() == batch[0].item()


class KernelOnTheCpu:
    """Stands the reference in for the CUDA kernel, recording what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[mx.array, mx.array, mx.array]] = []

    def __call__(
        self, logits: mx.array, temperatures: mx.array, seeds: mx.array, *, backend
    ) -> mx.array:
        assert backend is CUDA
        self.calls.append((logits, temperatures, seeds))
        return gumbel_max_sample_reference(logits, temperatures, seeds)


@pytest.fixture
def kernel_dispatch(monkeypatch) -> KernelOnTheCpu:
    kernel = KernelOnTheCpu()
    monkeypatch.setattr(sampler_module, "kernel_backend", lambda device: CUDA)
    monkeypatch.setattr(sampler_module, "gumbel_max_sample_kernel", kernel)
    return kernel


def test_the_kernel_draw_divides_by_a_final_temperature_once(kernel_dispatch):
    logits = mx.array(np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32))
    params = SamplingParams(temperature=0.6, top_k=10, seed=5)
    with mx.stream(mx.cpu):
        token = Sampler(params)(logits[0], mx.array([], dtype=mx.int32))
        batch = sample_batch(
            [Sampler(params), Sampler(dataclasses.replace(params, seed=6))], logits
        )
        key = mx.random.split(mx.random.split(mx.random.key(5))[0])[1]
    single, batched = kernel_dispatch.calls
    assert (
        single[1].tolist() == [pytest.approx(0.6)]
        and batched[1].tolist() == [pytest.approx(0.6)] * 2
    )
    kept = np.isfinite(np.array(single[0][0]))
    assert kept.sum() == 10
    assert np.array_equal(np.array(single[0][0])[kept], np.array(logits[0])[kept])
    assert mx.array_equal(single[2], key[None])
    assert token.item() == batch[0].item()


def test_a_temperature_before_other_stages_is_applied_by_the_chain(kernel_dispatch):
    logits = mx.array(np.random.default_rng(5).standard_normal(64).astype(np.float32))
    order = (SamplerStage.TEMPERATURE, SamplerStage.MIN_P)
    params = SamplingParams(temperature=0.5, min_p=0.05, samplers=order, seed=2)
    with mx.stream(mx.cpu):
        Sampler(params)(logits, mx.array([], dtype=mx.int32))
    ((processed, temperatures, _),) = kernel_dispatch.calls
    kept = np.isfinite(np.array(processed[0]))
    assert temperatures.tolist() == [1.0]
    np.testing.assert_allclose(np.array(processed[0])[kept], np.array(logits)[kept] / 0.5)


on_cuda = pytest.mark.skipif(not mx.cuda.is_available(), reason="needs a CUDA GPU")


def reference_on_the_cpu(logits: mx.array, temperatures: mx.array, seeds: mx.array) -> mx.array:
    with mx.stream(mx.cpu):
        return gumbel_max_sample_reference(logits, temperatures, seeds)


@on_cuda
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("num_rows", [1, 7, 64])
@pytest.mark.parametrize("vocab_size", [1000, 32000, 128256])
def test_kernel_picks_the_references_tokens(dtype, num_rows, vocab_size):
    rng = np.random.default_rng(vocab_size + num_rows)
    logits = (3.0 * rng.standard_normal((num_rows, vocab_size))).astype(np.float32)
    logits[:, rng.permutation(vocab_size)[: vocab_size // 3]] = NEG_INF
    logits = mx.array(logits).astype(dtype)
    temperatures = mx.array(rng.uniform(0.3, 1.5, num_rows).astype(np.float32))
    seeds = mx.array(rng.integers(0, 2**32, (num_rows, 2), dtype=np.uint32))
    tokens = np.array(gumbel_max_sample_cuda(logits, temperatures, seeds))
    expected = np.array(reference_on_the_cpu(logits, temperatures, seeds))
    # Where they differ, the two tokens' reference scores must tie within float rounding.
    with mx.stream(mx.cpu):
        gumbel = -mx.log(-mx.log(token_uniforms(seeds, vocab_size)))
        scores = np.array(logits.astype(mx.float32) / temperatures[:, None] + gumbel)
    rows = np.arange(num_rows)
    assert np.isfinite(scores[rows, tokens]).all()
    np.testing.assert_allclose(scores[rows, tokens], scores[rows, expected], rtol=1e-5, atol=1e-5)
    assert (tokens != expected).sum() <= 1


@on_cuda
def test_kernel_handles_removed_tokens_like_the_reference():
    logits = mx.array(
        [[NEG_INF, NEG_INF, 5.0, NEG_INF], [NEG_INF] * 4, [-30.0, NEG_INF, NEG_INF, -31.0]]
    )
    logits = mx.repeat(logits, 500, axis=0)
    temperatures = mx.full((1500,), 2.0, dtype=mx.float32)
    tokens = gumbel_max_sample_cuda(logits, temperatures, many_seeds(1500))
    assert mx.array_equal(tokens, reference_on_the_cpu(logits, temperatures, many_seeds(1500)))


@on_cuda
def test_kernel_draws_follow_the_tempered_softmax():
    tokens = draw_small(gumbel_max_sample_cuda)
    assert goodness_of_fit(tokens, SMALL_LOGITS, SMALL_TEMPERATURE) > 0.01


@on_cuda
def test_a_seeded_sampler_on_the_gpu_repeats_its_tokens():
    rng = np.random.default_rng(6)
    steps = [mx.array(rng.standard_normal((3, 32000)).astype(np.float32)) for _ in range(8)]
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=21)

    def run() -> tuple[list[int], list[list[int]]]:
        alone = Sampler(params)
        batched = [Sampler(dataclasses.replace(params, seed=21 + row)) for row in range(3)]
        history = mx.array([], dtype=mx.int32)
        return (
            [alone(step[0], history).item() for step in steps],
            [sample_batch(batched, step).tolist() for step in steps],
        )

    first = run()
    assert run() == first
    assert [row[0] for row in first[1]] == first[0]
