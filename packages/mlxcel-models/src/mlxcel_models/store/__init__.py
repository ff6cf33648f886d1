"""The model store: Hugging Face ids resolved to local folders, downloaded once.

`resolve_model` turns a model argument into a path `load_model` opens; `list_stored_models`,
`find_stored_model` and `remove_stored_model` manage `models_dir`.
"""

from mlxcel_models.store.config import DEFAULT_ORG, StoreConfig
from mlxcel_models.store.inventory import (
    StoredModel,
    StoreError,
    find_stored_model,
    list_stored_models,
    remove_stored_model,
)
from mlxcel_models.store.reference import ModelReference, parse_hub_id, parse_model_reference
from mlxcel_models.store.resolve import resolve_model

__all__ = [
    "DEFAULT_ORG",
    "ModelReference",
    "StoreConfig",
    "StoreError",
    "StoredModel",
    "find_stored_model",
    "list_stored_models",
    "parse_hub_id",
    "parse_model_reference",
    "remove_stored_model",
    "resolve_model",
]
