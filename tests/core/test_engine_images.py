"""Requests with images through the continuous-batching engine.

The model is the tiny float32 llama wrapped as an `ImageLanguageModel` whose vision
encoder maps an image to features fixed by its content hash, so outputs depend on which
image a prompt holds, and which counts its encoder calls. Every batched, chunked, cached,
forked, preempted or speculative run must give the tokens the same request gives alone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import replace

import mlx.core as mx
import pytest
from test_batching_engine import (
    BLOCK_SIZE,
    GREEDY,
    NullDetokenizer,
    generate_all,
    make_config,
    running_engine,
    token_ids,
)

from mlxcel_core.cache import KVCache
from mlxcel_core.cache.paged import KeyedSpan, KVCacheManager, hash_token_blocks
from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineOutput,
    EngineRequest,
    ImagesNotSupportedError,
    ModelRunner,
    OutputQueue,
    SchedulerConfig,
)
from mlxcel_core.images import PromptImage, RowImages
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.speculative import SpeculativeConfig, SpeculativeMethod
from mlxcel_models.language_model import MlxLmLanguageModel
from mlxcel_models.loading.loader import load_model

PLACEHOLDER = 3
GENERATION = GenerationConfig(context_size=48, max_tokens=10)
# Text 0-5, the image's 8 placeholders 6-13, text 14-19: blocks of 4 put positions 4-7
# and 12-15 half in the image, and a chunk of 8 splits it after position 7.
IMAGE_START, IMAGE_TOKENS = 6, 8
PROMPT = (*range(40, 46), *[PLACEHOLDER] * IMAGE_TOKENS, *range(50, 56))
TEXT_PROMPTS = (tuple(range(60, 71)), tuple(range(80, 97)))


def content_hash(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


RED, BLUE = content_hash("red"), content_hash("blue")


def image(digest: str, start: int = IMAGE_START) -> PromptImage:
    return PromptImage(start, IMAGE_TOKENS, digest, inputs=None)


class HashedImageModel:
    """The tiny llama with a vision encoder whose features are fixed by the content hash.

    A pass with images embeds the tokens, writes each image's features over its
    placeholders among the pass's positions, and runs the decoder on the embeddings; a
    pass without images is the text model's own call.

    Attributes:
        encoded: the content hash of every encoder call, in order.
        passes: per forward pass, the images it was given (None for a text-only call).
    """

    supports_images = True

    def __init__(self, text_model: MlxLmLanguageModel) -> None:
        self.text_model = text_model
        self.body = text_model.module.model
        self.encoded: list[str] = []
        self.passes: list[list[RowImages] | None] = []

    def make_cache(self) -> list[KVCache]:
        return self.text_model.make_cache()

    def encode(self, prompt_image: PromptImage) -> mx.array:
        """(num_tokens, hidden) float32 features drawn from a key made of the hash."""
        self.encoded.append(prompt_image.content_hash)
        key = mx.random.key(int(prompt_image.content_hash[:8], 16))
        hidden = self.body.embed_tokens.weight.shape[1]
        return mx.random.normal((prompt_image.num_tokens, hidden), key=key)

    def __call__(
        self,
        tokens: mx.array,
        cache: Sequence[KVCache],
        *,
        last_only: bool = False,
        images: Sequence[RowImages] | None = None,
    ) -> mx.array:
        self.passes.append(None if images is None else list(images))
        if images is None:
            return self.text_model(tokens, cache, last_only=last_only)
        _, L = tokens.shape
        embeddings = self.body.embed_tokens(tokens)
        for row, row_images in enumerate(images):
            offset = row_images.offset
            for prompt_image in row_images.images:
                first = max(prompt_image.start, offset)
                stop = min(prompt_image.stop, offset + L)
                if first < stop:
                    features = self.encode(prompt_image)
                    embeddings[row, first - offset : stop - offset] = features[
                        first - prompt_image.start : stop - prompt_image.start
                    ]
        hidden = self.body(tokens, cache=cache, input_embeddings=embeddings)
        if last_only:
            hidden = hidden[:, -1:]
        return self.body.embed_tokens.as_linear(hidden)


@pytest.fixture(scope="module")
def text_model(tiny_safetensors) -> MlxLmLanguageModel:
    return load_model(tiny_safetensors).model


@pytest.fixture
def model(text_model) -> HashedImageModel:
    return HashedImageModel(text_model)


def make_request(
    prompt: Sequence[int] = PROMPT,
    images: Sequence[PromptImage] = (),
    *,
    index: int = 0,
    sampling: SamplingParams = GREEDY,
) -> EngineRequest:
    return EngineRequest(
        prompt_ids=tuple(prompt),
        sampling=sampling,
        generation=GENERATION,
        detokenizer=NullDetokenizer(),
        index=index,
        images=tuple(images),
    )


def run_alone(model, request: EngineRequest, config: EngineConfig | None = None) -> list[int]:
    """The request's tokens on an engine of its own (by default its prompt in one chunk)."""
    config = (
        make_config(scheduler=SchedulerConfig(max_prefill_chunk=32)) if config is None else config
    )
    with running_engine(model, config) as engine:
        (outputs,) = generate_all(engine, [replace(request, index=0)])
    return token_ids(outputs)


def cached_tokens(outputs: Sequence[EngineOutput]) -> int:
    return outputs[-1].stats.cached_tokens


# What the model is given


def test_an_images_features_change_the_output_and_text_passes_stay_text_only(model):
    red_image = image(RED)
    red = run_alone(model, make_request(images=[red_image]))
    encoded, passes = list(model.encoded), list(model.passes)
    model.passes.clear()
    text = run_alone(model, make_request())
    assert red != text
    assert encoded == [RED]
    # Every pass of the image request had its images, decode included (10 tokens: the
    # prompt's pass, then 9 decode passes); the text request's passes had none.
    image_passes = [p for p in passes if p is not None]
    assert [p[0].offset for p in image_passes] == [0, *range(len(PROMPT), len(PROMPT) + 9)]
    assert all(p[0].images == (red_image,) for p in image_passes)
    assert all(p is None for p in model.passes)


def test_text_and_image_requests_batched_together_each_equal_their_solo_runs(model):
    requests = [
        make_request(images=[image(RED)], index=0),
        make_request(TEXT_PROMPTS[0], index=1),
        make_request(images=[image(BLUE)], index=2),
        make_request(TEXT_PROMPTS[1], index=3),
    ]
    alone = [run_alone(model, request) for request in requests]
    model.passes.clear()
    with running_engine(model, make_config()) as engine:
        outputs = generate_all(engine, requests)
    assert [token_ids(o) for o in outputs] == alone
    assert alone[0] != alone[2]
    # Decode passes mixed the rows: image rows with their images, text rows with none.
    mixed = [p for p in model.passes if p is not None and len(p) == 4]
    assert mixed
    assert all([bool(row.images) for row in p] == [True, False, True, False] for p in mixed)


def test_an_image_split_across_prefill_chunks_gives_the_tokens_of_one_chunk(model):
    request = make_request(images=[image(RED)])
    whole = run_alone(model, request)
    assert model.encoded == [RED]
    model.encoded.clear()
    chunked = run_alone(model, request, make_config(enable_prefix_caching=False))
    assert chunked == whole
    # Chunks of 8 (positions 0-7, 8-15) each hold part of the image.
    assert model.encoded == [RED, RED]


def test_preemption_and_recompute_keep_image_outputs(model):
    requests = [
        make_request(images=[image(RED)], index=0),
        make_request(TEXT_PROMPTS[1], index=1),
        make_request(images=[image(BLUE)], index=2),
        make_request(images=[image(RED, start=2)], index=3),
    ]
    alone = [run_alone(model, request) for request in requests]
    # 13 usable blocks of 4 hold one 30-token sequence, not four.
    with running_engine(model, make_config(num_kv_blocks=14)) as engine:
        outputs = generate_all(engine, requests)
        assert engine.stats.num_preemptions > 0
    assert [token_ids(o) for o in outputs] == alone


def test_choices_of_an_image_prompt_fork_its_kv_and_each_equal_their_solo_run(model):
    samplings = [SamplingParams(temperature=0.9, seed=seed) for seed in (1, 2, 3)]
    requests = [
        make_request(images=[image(RED)], index=i, sampling=s) for i, s in enumerate(samplings)
    ]
    alone = [run_alone(model, request) for request in requests]
    model.encoded.clear()
    with running_engine(model, make_config()) as engine:
        outputs = generate_all(engine, requests)
    assert [token_ids(o) for o in outputs] == alone
    assert len({tuple(ids) for ids in alone}) == 3
    assert [cached_tokens(o) for o in outputs] == [0, len(PROMPT) - 1, len(PROMPT) - 1]
    assert model.encoded == [RED, RED]  # the first choice's two prefill chunks only


@pytest.mark.parametrize("method", list(SpeculativeMethod))
def test_speculative_decoding_verifies_with_the_images(model, text_model, method):
    """The draft stays text-only; the target's verify passes carry the row's images, so
    greedy output is the output without drafts."""
    request = make_request(images=[image(RED)])
    expected = run_alone(model, request)
    spec = SpeculativeConfig(method=method, num_draft_tokens=4, draft_p_min=0.0)
    draft = text_model if method is SpeculativeMethod.DRAFT_MODEL else None
    model.passes.clear()
    with running_engine(model, make_config(speculative=spec), draft) as engine:
        (outputs,) = generate_all(engine, [request])
    assert token_ids(outputs) == expected
    assert outputs[-1].stats.draft_tokens > 0
    verify_passes = [p for p in model.passes if p is not None and p[0].offset >= len(PROMPT)]
    assert verify_passes
    assert all(p[0].images[0].content_hash == RED for p in verify_passes)


# Prefix caching of image blocks


def test_the_same_image_reuses_the_prefix_without_encoding_again(model):
    with running_engine(model, make_config()) as engine:
        (first,) = generate_all(engine, [make_request(images=[image(RED)])])
        encoded = len(model.encoded)
        (second,) = generate_all(engine, [make_request(images=[image(RED)])])
    assert token_ids(first) == token_ids(second)
    # 4 full blocks of the 20-token prompt are reused; the image (6-13) lies in them.
    assert (cached_tokens(first), cached_tokens(second)) == (0, 16)
    assert len(model.encoded) == encoded


def test_another_image_with_equal_placeholders_reuses_only_the_text_before_it(model):
    with running_engine(model, make_config()) as engine:
        (red,) = generate_all(engine, [make_request(images=[image(RED)])])
        model.encoded.clear()
        (blue,) = generate_all(engine, [make_request(images=[image(BLUE)])])
        (moved,) = generate_all(engine, [make_request(images=[image(RED, start=5)])])
    assert token_ids(red) != token_ids(blue)
    assert token_ids(blue) == run_alone(model, make_request(images=[image(BLUE)]))
    # Only block 0-3 holds no placeholder of either image.
    assert cached_tokens(blue) == 4
    assert cached_tokens(moved) == 4
    assert BLUE in model.encoded


def test_text_block_hashes_are_unchanged_and_image_blocks_are_keyed_by_the_image():
    manager = KVCacheManager(16, BLOCK_SIZE)
    red = (KeyedSpan(IMAGE_START, IMAGE_START + IMAGE_TOKENS, RED),)
    manager.admit(1, PROMPT, len(PROMPT), spans=red)
    manager.commit(1, PROMPT, len(PROMPT))
    detached = manager.detach(1)
    plain = hash_token_blocks(PROMPT, BLOCK_SIZE)
    keyed = hash_token_blocks(PROMPT, BLOCK_SIZE, spans=red)
    assert detached.block_hashes == tuple(keyed)
    assert detached.spans == red
    assert keyed[0] == plain[0]  # positions 0-3 hold no placeholder
    assert all(k != p for k, p in zip(keyed[1:], plain[1:], strict=True))
    # Committing from the middle keys the later blocks as committing all at once does.
    assert (
        hash_token_blocks(PROMPT[8:], BLOCK_SIZE, keyed[1], spans=red, first_position=8)
        == (keyed[2:])
    )
    # The adopter keeps the spans: its later blocks are keyed by the image too.
    manager.adopt(2, detached)
    assert manager.admit(3, PROMPT, 1, spans=red) == 16
    assert manager.admit(4, PROMPT, 1) == 4


# Refusals


class FakeRemotePrefill:
    def submit(self, job) -> None:
        raise AssertionError("no prompt should be sent")

    def close(self) -> None:
        pass


def make_runner(model, storage, adapters) -> ModelRunner:
    return ModelRunner(model, storage, adapters=adapters)


@pytest.mark.parametrize(
    ("engine_kwargs", "message"),
    [
        ({}, "the model has no vision support"),
        ({"make_runner": make_runner}, "across ranks (tensor or pipeline parallelism)"),
        (
            {"make_remote_prefill": lambda storage, deliver: FakeRemotePrefill()},
            "disaggregated prefill",
        ),
    ],
    ids=["text-only model", "lockstep", "disaggregated"],
)
def test_requests_with_images_are_refused_where_images_cannot_run(
    text_model, model, engine_kwargs, message
):
    target = text_model if not engine_kwargs else model
    engine = Engine(target, make_config(), **engine_kwargs)
    try:
        with pytest.raises(ImagesNotSupportedError, match=re.escape(message)) as refused:
            engine.submit([make_request(images=[image(RED)])], OutputQueue())
        assert isinstance(refused.value, ValueError)
        assert engine.num_waiting == 0
    finally:
        engine.shutdown(timeout=20.0)


@pytest.mark.parametrize(
    ("images", "message"),
    [
        ([image(RED, start=15)], "fills positions 15..22 of a 20-token prompt"),
        ([image(RED), image(BLUE, start=10)], "overlaps"),
    ],
)
def test_images_outside_the_prompt_or_overlapping_are_refused(images, message):
    with pytest.raises(ValueError, match=message):
        make_request(images=images)
