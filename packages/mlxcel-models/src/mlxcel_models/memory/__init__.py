"""Memory estimates before loading: weights, KV cache and activations from a model's
headers, and the memory the device can give."""

from mlxcel_models.memory.budget import MemoryBudget, available_memory_bytes, device_memory_budget
from mlxcel_models.memory.estimate import (
    ContextRequest,
    MemoryEstimate,
    WeightEstimate,
    activation_bytes,
    activation_dtype,
    cache_geometry,
    estimate_memory,
    estimate_weights,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_group_bytes_per_token,
    kv_layers,
    sequences_kv_bytes,
    sequences_residual_bytes,
)
from mlxcel_models.memory.inventory import (
    Architecture,
    ModelInventory,
    WeightTensor,
    read_model_inventory,
)

__all__ = [
    "Architecture",
    "ContextRequest",
    "MemoryBudget",
    "MemoryEstimate",
    "ModelInventory",
    "WeightEstimate",
    "WeightTensor",
    "activation_bytes",
    "activation_dtype",
    "available_memory_bytes",
    "cache_geometry",
    "device_memory_budget",
    "estimate_memory",
    "estimate_weights",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_group_bytes_per_token",
    "kv_layers",
    "read_model_inventory",
    "sequences_kv_bytes",
    "sequences_residual_bytes",
]
