"""What a model's caches hold, before loading it: its layers' cache kinds and sizes.

The layout comes from mlx-lm's own caches for the model (`mlx_lm_cache_layout`), which
needs the model's module but none of its weights: the module is built from the config with
MLX's lazy random initialization, never evaluated. For a plain model (one attention cache
per layer) the keys and values follow from the header's numbers; for a hybrid one (state
layers, several caches in a layer) one token's pass is traced through recording caches
(`trace_cache_geometry`), which again evaluates nothing: MLX knows every array's shape and
dtype as the graph is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel_core.cache.layout import CacheLayout
from mlxcel_core.cache.paged import LayerGeometry
from mlxcel_core.cache.state import StateLayerGeometry
from mlxcel_core.engine.memory import trace_cache_geometry
from mlxcel_models.cache_kinds import UnsupportedCacheError
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.language_model import MlxLmLanguageModel
from mlxcel_models.memory.inventory import ModelInventory
from mlxcel_models.metadata import ModelKind
from mlxcel_models.mlx_lm_models import make_mlx_lm_model


@dataclass(frozen=True)
class ModelCacheGeometry:
    """A model's cache layout and the geometry of its attention and state parts.

    Attributes:
        layout: what each layer keeps.
        layers: each attention part's key/value geometry.
        state_layers: each state part's array geometry.
    """

    layout: CacheLayout
    layers: tuple[LayerGeometry, ...]
    state_layers: tuple[StateLayerGeometry, ...] = ()


def model_cache_geometry(
    inventory: ModelInventory, options: ComputeOptions, plain: tuple[LayerGeometry, ...]
) -> ModelCacheGeometry:
    """The caches of `inventory`'s model as the engine will hold them.

    Args:
        inventory: the model's headers and config.
        options: the device's compute options (the activations' dtype).
        plain: the key/value geometry of every layer as the header's numbers give it,
            taken for a model whose layers each keep one attention cache (and for
            vision-language models, whose text model is such).

    Raises:
        UnsupportedCacheError: a layer keeps a cache the engine has no kind for.
    """
    if inventory.family.kind is not ModelKind.TEXT:
        return ModelCacheGeometry(CacheLayout.all_attention(len(plain)), plain)
    module = make_mlx_lm_model(inventory.config, where=inventory.source.config_file)
    dtype = options.float_dtype or (plain[0].dtype if plain else None)
    if dtype is not None:
        module.set_dtype(dtype)
    try:
        model = MlxLmLanguageModel.for_tracing(module)
    except UnsupportedCacheError as error:
        raise error.of_model(inventory.source.path, inventory.source.model_type) from error
    layout = model.cache_layout
    # A model may keep fewer caches than it has layers (Nemotron-NAS layers without
    # attention keep none): then only a traced pass says which layers' geometry counts.
    if layout.is_plain and len(layout.layers) == len(plain):
        return ModelCacheGeometry(layout, plain)
    _, traced = trace_cache_geometry(model, 1, layout)
    return ModelCacheGeometry(layout, traced.layers, traced.state_layers)
