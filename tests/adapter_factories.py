"""LoRA adapters for the tiny models, written as mlx-lm and as PEFT folders.

Both writers take the same updates in mlx-lm's layout (`{module}.lora_a` (in, r),
`{module}.lora_b` (r, out)), so the two folders describe one adapter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import mlx.core as mx
import numpy as np

from factories import TinyConfig

TARGETS = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")


def _dims(config: TinyConfig, target: str) -> tuple[int, int]:
    """(in, out) of a target linear layer."""
    D, F = config.hidden_size, config.intermediate_size
    H, K, hd = config.num_heads, config.num_kv_heads, config.head_dim
    return {
        "self_attn.q_proj": (D, H * hd),
        "self_attn.k_proj": (D, K * hd),
        "self_attn.v_proj": (D, K * hd),
        "self_attn.o_proj": (H * hd, D),
        "mlp.gate_proj": (D, F),
        "mlp.up_proj": (D, F),
        "mlp.down_proj": (F, D),
    }[target]


TINY = TinyConfig()


def random_updates(
    shapes: Mapping[str, tuple[int, int]], *, rank: int = 8, seed: int = 1
) -> dict[str, np.ndarray]:
    """Random rank-`rank` updates with non-zero B for modules of the given (in, out) shapes."""
    rng = np.random.default_rng(seed)
    updates = {}
    for name, (inputs, outputs) in shapes.items():
        a = rng.standard_normal((inputs, rank)) / np.sqrt(inputs)
        updates[f"{name}.lora_a"] = a.astype(np.float32)
        b = rng.standard_normal((rank, outputs)) / np.sqrt(rank)
        updates[f"{name}.lora_b"] = b.astype(np.float32)
    return updates


def lora_updates(
    config: TinyConfig = TINY, *, rank: int = 8, seed: int = 1, targets=TARGETS
) -> dict[str, np.ndarray]:
    """Random updates for every layer's `targets` of a tiny model, mlx-lm names."""
    shapes = {
        f"model.layers.{layer}.{target}": _dims(config, target)
        for layer in range(config.num_layers)
        for target in targets
    }
    return random_updates(shapes, rank=rank, seed=seed)


def write_mlx_lm_adapter(folder: Path, updates: dict[str, np.ndarray], scale: float) -> Path:
    """An mlx-lm adapter folder (`mlx_lm.lora`'s output layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    rank = next(v.shape[1] for k, v in updates.items() if k.endswith(".lora_a"))
    config = {
        "fine_tune_type": "lora",
        "num_layers": -1,
        "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0},
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    mx.save_safetensors(
        str(folder / "adapters.safetensors"), {k: mx.array(v) for k, v in updates.items()}
    )
    return folder


def write_peft_adapter(
    folder: Path, updates: dict[str, np.ndarray], *, lora_alpha: float, use_rslora: bool = False
) -> Path:
    """A PEFT adapter folder: the same updates transposed, under PEFT's names."""
    folder.mkdir(parents=True, exist_ok=True)
    rank = next(v.shape[1] for k, v in updates.items() if k.endswith(".lora_a"))
    tensors = {}
    for name, value in updates.items():
        module, kind = name.rsplit(".", 1)
        peft_kind = {"lora_a": "lora_A", "lora_b": "lora_B"}[kind]
        key = f"base_model.model.{module}.{peft_kind}.weight"
        tensors[key] = np.ascontiguousarray(value.T)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": lora_alpha,
        "use_rslora": use_rslora,
        "use_dora": False,
        "rank_pattern": {},
        "alpha_pattern": {},
        "target_modules": sorted({t.rsplit(".", 1)[-1] for t in TARGETS}),
        "task_type": "CAUSAL_LM",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    mx.save_safetensors(
        str(folder / "adapter_model.safetensors"), {k: mx.array(v) for k, v in tensors.items()}
    )
    return folder
