"""An engine's refusal of images reaches the client as a 400 saying why, not a 500."""

from __future__ import annotations

import asyncio

import pytest

from mlxcel_core.engine import Engine, EngineRequest
from mlxcel_core.images import PromptImage
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_server import ServingModel
from mlxcel_server.errors import ApiError
from mlxcel_server.generation import Prepared, collect


def test_images_for_a_text_only_model_are_a_400_naming_the_reason(tiny_loaded):
    engine = Engine(tiny_loaded.model)
    try:
        model = ServingModel(tiny_loaded, engine, "tiny", 256)
        request = EngineRequest(
            prompt_ids=(1, 2, 2, 2, 3),
            sampling=SamplingParams(temperature=0.0),
            generation=GenerationConfig(context_size=256, max_tokens=2),
            detokenizer=tiny_loaded.tokenizer.make_detokenizer(),
            images=(PromptImage(1, 3, "0123abcd"),),
        )
        prepared = Prepared((request,), 1, 5, "chatcmpl-images", 0, "tiny")
        with pytest.raises(ApiError) as refused:
            asyncio.run(collect(model, prepared))
        assert refused.value.status == 400
        assert refused.value.message == "the model has no vision support: it cannot take images"
        assert engine.num_waiting == 0
    finally:
        engine.shutdown(timeout=10)
