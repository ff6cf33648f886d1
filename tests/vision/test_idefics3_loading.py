"""Loading Idefics3 folders: mlx-vlm's layouts, the hub's processor file, strict tensor
checks, and preprocessing without torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from idefics3_factory import IMAGE_SEQ_LEN, IMAGE_SIZE, write_idefics3_model
from PIL import Image

from mlxcel_core.cache import DenseKVCache
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.metadata import ModelKind, WeightFormat, family_for
from mlxcel_vision.families.idefics3 import load_parts

pytest.importorskip("torch")

FLOAT32 = ComputeOptions(float_dtype=mx.float32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_idefics3_model(tmp_path_factory.mktemp("hf") / "idefics3")


def load(folder):
    return load_parts(folder, json.loads((folder / "config.json").read_text()), FLOAT32)


def copy_with_weights(source, target, weights: dict[str, mx.array]):
    shutil.copytree(source, target)
    (target / "model.safetensors").unlink()
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    return target


def hugging_face_weights(folder) -> dict[str, mx.array]:
    return mx.load(str(folder / "model.safetensors"))


def mlx_vlm_name(name: str, *, nested_text_body: bool) -> str:
    """mlx-vlm's converter: `model.` dropped, the text model as `language_model`."""
    if name.startswith("lm_head."):
        return "language_model." + name
    name = name.removeprefix("model.")
    body = "language_model.model." if nested_text_body else "language_model."
    return name.replace("text_model.", body, 1) if name.startswith("text_model.") else name


def outputs(parts, image: Image.Image) -> tuple[np.ndarray, np.ndarray]:
    """The image's features and the logits of a prompt made of its placeholders."""
    runs = parts.processor.prepare(image).runs
    features = mx.concatenate([parts.encoder(run.inputs) for run in runs])
    cache = [DenseKVCache() for _ in range(parts.decoder.num_layers)]
    logits = parts.decoder(features[None], cache)
    return np.array(features), np.array(logits)


@pytest.mark.parametrize("nested_text_body", [True, False])
def test_mlx_vlm_layout_loads_the_same_model(folder, tmp_path, nested_text_body):
    weights = {
        mlx_vlm_name(name, nested_text_body=nested_text_body): array
        for name, array in hugging_face_weights(folder).items()
    }
    conv = "vision_model.embeddings.patch_embedding.weight"
    weights[conv] = weights[conv].transpose(0, 2, 3, 1)
    converted = copy_with_weights(folder, tmp_path / "mlx-vlm", weights)
    image = Image.new("RGB", (40, 56), "teal")

    expected_features, expected_logits = outputs(load(folder), image)
    features, logits = outputs(load(converted), image)

    np.testing.assert_array_equal(features, expected_features)
    np.testing.assert_array_equal(logits, expected_logits)


def test_unexpected_tensor_is_named(folder, tmp_path):
    weights = {**hugging_face_weights(folder), "model.connector.extra.weight": mx.zeros((2,))}
    broken = copy_with_weights(folder, tmp_path / "extra", weights)
    with pytest.raises(ModelLoadError, match=r"unexpected .*connector\.extra\.weight"):
        load(broken)


def test_missing_tensor_is_named(folder, tmp_path):
    weights = hugging_face_weights(folder)
    del weights["model.vision_model.post_layernorm.bias"]
    broken = copy_with_weights(folder, tmp_path / "missing", weights)
    with pytest.raises(ModelLoadError, match=r"lack .*post_layernorm\.bias"):
        load(broken)


def test_misshapen_tensor_is_refused(folder, tmp_path):
    weights = hugging_face_weights(folder)
    weights["model.connector.modality_projection.proj.weight"] = mx.zeros((3, 3))
    broken = copy_with_weights(folder, tmp_path / "shape", weights)
    with pytest.raises(ModelLoadError, match="modality_projection"):
        load(broken)


def test_hub_preprocessor_config_gives_the_same_pixels(folder, tmp_path):
    hub = shutil.copytree(folder, tmp_path / "hub")
    processor_config = json.loads((hub / "processor_config.json").read_text())
    (hub / "preprocessor_config.json").write_text(json.dumps(processor_config["image_processor"]))
    (hub / "processor_config.json").write_text(json.dumps({"image_seq_len": IMAGE_SEQ_LEN}))
    image = Image.new("RGB", (70, 30), "orange")

    expected = load(folder).processor.prepare(image)
    prepared = load(hub).processor.prepare(image)

    assert prepared.text == expected.text
    for run, expected_run in zip(prepared.runs, expected.runs, strict=True):
        np.testing.assert_array_equal(np.array(run.inputs), np.array(expected_run.inputs))


def test_tiles_other_than_the_towers_are_refused(folder, tmp_path):
    odd = shutil.copytree(folder, tmp_path / "odd")
    processor_config = json.loads((odd / "processor_config.json").read_text())
    processor_config["image_processor"]["max_image_size"] = {"longest_edge": 2 * IMAGE_SIZE}
    (odd / "processor_config.json").write_text(json.dumps(processor_config))
    with pytest.raises(ModelLoadError, match=f"tiles are {2 * IMAGE_SIZE} pixels"):
        load(odd)


@pytest.mark.parametrize("model_type", ["idefics3", "smolvlm"])
def test_family_is_a_safetensors_vlm(model_type):
    family = family_for(model_type, WeightFormat.SAFETENSORS)
    assert family.kind is ModelKind.VLM
    with pytest.raises(ModelLoadError):
        family_for(model_type, WeightFormat.GGUF)


def test_preprocessing_runs_without_torch(folder):
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        from pathlib import Path

        find_spec = importlib.util.find_spec
        importlib.util.find_spec = lambda name, package=None: (
            None if name.split(".")[0] == "torch" else find_spec(name, package)
        )

        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "torch":
                    raise ModuleNotFoundError(name)

        sys.meta_path.insert(0, NoTorch())
        from PIL import Image
        from mlxcel_vision.families.idefics3.processor import Idefics3ImageProcessor

        processor = Idefics3ImageProcessor.from_folder(
            Path({str(folder)!r}), tile_size={IMAGE_SIZE}, image_seq_len={IMAGE_SEQ_LEN},
            placeholder_token_id=0,
        )
        prepared = processor.prepare(Image.new("RGB", (64, 64), "red"))
        print(len(prepared.runs), "torch" in sys.modules)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.split() == ["5", "False"]


def test_quantized_mlx_vlm_folder_loads_as_stored(folder, tmp_path):
    from mlx.utils import tree_flatten

    reference = load(folder)
    lm_head = {"group_size": 64, "bits": 4}
    nn.quantize(
        reference.module,
        group_size=32,
        bits=8,
        class_predicate=lambda path, layer: (
            lm_head if path == "text_model.lm_head" else isinstance(layer, nn.Linear | nn.Embedding)
        ),
    )
    weights = {
        name.removeprefix("encoder.").replace("text_model.", "language_model.", 1): array
        for name, array in tree_flatten(reference.module.parameters())
    }
    quantized = copy_with_weights(folder, tmp_path / "mlx-vlm-8bit", weights)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 8, "language_model.lm_head": lm_head}
    (quantized / "config.json").write_text(json.dumps(config))
    image = Image.new("RGB", (64, 64), "navy")

    parts = load(quantized)

    assert isinstance(parts.module.text_model.lm_head, nn.QuantizedLinear)
    assert parts.module.text_model.lm_head.bits == 4
    assert parts.module.encoder.connector.modality_projection.proj.bits == 8
    for got, expected in zip(outputs(parts, image), outputs(reference, image), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_config_without_default_settings_loads_the_same_model(folder, tmp_path):
    sparse = shutil.copytree(folder, tmp_path / "sparse")
    config = json.loads((sparse / "config.json").read_text())
    for key in ("attention_dropout", "hidden_act", "layer_norm_eps", "num_channels"):
        del config["vision_config"][key]
    for key in ("attention_bias", "hidden_act", "mlp_bias", "rope_parameters", "head_dim"):
        del config["text_config"][key]
    del config["tie_word_embeddings"]
    (sparse / "config.json").write_text(json.dumps(config))
    image = Image.new("RGB", (64, 64), "olive")

    for got, expected in zip(
        outputs(load(sparse), image), outputs(load(folder), image), strict=True
    ):
        np.testing.assert_array_equal(got, expected)
