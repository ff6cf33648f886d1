"""Loading LLaVA folders: through the app's loading path, strictly, and what the other
readers of a model folder (the text loader, the memory inventory, the CLI) make of them."""

from __future__ import annotations

import io
import json
import re
import shutil

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from llava_factory import write_llava_model

from mlxcel.cli import main
from mlxcel.common.loading import load_for_command
from mlxcel_core.images import RowImages
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.loader import load_model
from mlxcel_models.memory import read_model_inventory
from mlxcel_models.metadata import ModelKind
from mlxcel_models.store import StoreConfig
from mlxcel_models.surgery import parse_surgery
from mlxcel_vision.loading import load_vision_model

FLOAT32 = ComputeOptions(float_dtype=mx.float32)


@pytest.fixture
def folder_copy(tiny_llava, tmp_path):
    return shutil.copytree(tiny_llava, tmp_path / "copy")


def edit_weights(folder, edit) -> None:
    path = str(folder / "model.safetensors")
    weights = dict(mx.load(path))
    edit(weights)
    mx.save_safetensors(path, weights)


def test_the_app_loads_a_vision_language_model_with_its_prompter(tiny_llava, tmp_path):
    store = StoreConfig(tmp_path / "store", tmp_path / "hf", offline=True)
    loaded = load_for_command(str(tiny_llava), store=store, compute=FLOAT32)
    assert loaded.family.kind is ModelKind.VLM
    assert loaded.image_prompter is not None
    assert loaded.image_prompter.image_marker == "<image>"
    assert (loaded.config.context_length, loaded.config.vocab_size) == (256, 264)
    assert loaded.config.num_layers == 2
    assert loaded.config.num_parameters == sum(
        array.size for _, array in nn.utils.tree_flatten(loaded.model.module.parameters())
    )


def test_surgery_is_refused_for_a_vision_language_model(tiny_llava, tmp_path):
    store = StoreConfig(tmp_path / "store", tmp_path / "hf", offline=True)
    plan = parse_surgery("edits:\n  - {op: prune, layers: 0-1}\n", tmp_path / "s.yaml")
    with pytest.raises(ModelLoadError, match="surgery does not apply to vlm models"):
        load_for_command(str(tiny_llava), store=store, surgery=plan)


def test_the_text_loader_points_to_the_vision_loader(tiny_llava):
    with pytest.raises(ModelLoadError, match=r"vision-language model.*load_vision_model"):
        load_model(tiny_llava)


def test_a_missing_tensor_is_named(folder_copy):
    name = "language_model.model.layers.1.mlp.up_proj.weight"
    edit_weights(folder_copy, lambda weights: weights.pop(name))
    with pytest.raises(ModelLoadError, match=re.escape(f"lack {name}") + "$"):
        load_vision_model(folder_copy)


def test_an_unexpected_tensor_is_named(folder_copy):
    edit_weights(
        folder_copy, lambda weights: weights.update({"vision_tower.extra.weight": mx.zeros(3)})
    )
    with pytest.raises(ModelLoadError, match=r"unexpected tensor vision_tower\.extra\.weight$"):
        load_vision_model(folder_copy)


def test_a_misshapen_tensor_is_named(folder_copy):
    name = "multi_modal_projector.linear_1.bias"
    edit_weights(folder_copy, lambda weights: weights.update({name: mx.zeros(5)}))
    with pytest.raises(ModelLoadError, match=re.escape(f"tensor {name} has shape (5,)")):
        load_vision_model(folder_copy)


def test_folder_problems_are_one_line_errors(folder_copy):
    (folder_copy / "preprocessor_config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"has no preprocessor_config\.json"):
        load_vision_model(folder_copy)
    config = json.loads((folder_copy / "config.json").read_text())
    config["vision_config"]["model_type"] = "siglip_vision_model"
    (folder_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="unsupported LLaVA vision tower"):
        load_vision_model(folder_copy)
    config["vision_config"]["model_type"] = "clip_vision_model"
    config |= {"model_type": "llava_next", "vision_feature_select_strategy": "full"}
    (folder_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="LLaVA-NeXT needs vision_feature_select_strategy"):
        load_vision_model(folder_copy)


def test_an_mlx_vlm_quantized_folder_loads_quantized(tmp_path):
    folder = write_llava_model(tmp_path / "llava", layout="mlx_vlm")
    float_logits = logits_with_image(load_vision_model(folder, compute=FLOAT32))
    config = json.loads((folder / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 8}
    (folder / "config.json").write_text(json.dumps(config))

    def quantize_text_layers(weights):
        for name in [n for n in weights if n.startswith("language_model.model.layers.")]:
            if name.endswith("proj.weight"):
                layer = name.removesuffix(".weight")
                packed, scales, biases = mx.quantize(weights[name], group_size=32, bits=8)
                weights.update({name: packed, f"{layer}.scales": scales, f"{layer}.biases": biases})

    edit_weights(folder, quantize_text_layers)
    loaded = load_vision_model(folder, compute=FLOAT32)
    layers = loaded.model.module.language_model.model.layers
    assert isinstance(layers[0].self_attn.q_proj, nn.QuantizedLinear)
    quantized_logits = logits_with_image(loaded)
    assert 0 < np.abs(quantized_logits - float_logits).max() < 0.05


def logits_with_image(loaded) -> np.ndarray:
    from PIL import Image

    prompt = loaded.image_prompter.encode("<image>hi", [Image.new("RGB", (40, 40), (9, 99, 199))])
    logits = loaded.model(
        mx.array([prompt.prompt_ids]),
        loaded.model.make_cache(),
        images=[RowImages(0, prompt.images)],
    )
    return np.array(logits)


def test_the_memory_inventory_reads_the_text_model(tiny_llava):
    inventory = read_model_inventory(tiny_llava)
    architecture = inventory.architecture
    assert (architecture.num_layers, architecture.hidden_size, architecture.vocab_size) == (
        2,
        64,
        264,
    )
    assert any(tensor.name.startswith("vision_tower.") for tensor in inventory.tensors)


def test_generate_and_inspect_run_on_a_vision_language_folder(tiny_llava):
    for argv in (
        ["generate", "-m", str(tiny_llava), "-p", "hello", "--temp", "0", "-n", "3"],
        ["inspect", "-m", str(tiny_llava)],
    ):
        out, err = io.StringIO(), io.StringIO()
        assert main(argv, environ={}, out=out, err=err) == 0, err.getvalue()
        assert "Traceback" not in err.getvalue()
