"""GGUF tensor names → mlx-lm parameter paths, from gguf-py's own `TensorNameMap` read in
reverse.

`TensorNameMap(arch, n_blocks)` is the table llama.cpp's converter names tensors with: it
maps each Hugging Face parameter name (without `.weight` / `.bias`) of an architecture to its
GGUF name. mlx-lm's parameters keep the Hugging Face names, except where the architecture
says otherwise (`GGUFArchitecture.name_aliases`), so mapping every parameter of the mlx-lm
model forward and inverting gives the loader's table.
"""

from __future__ import annotations

import gguf

from mlxcel_models.loading.gguf_architecture import GGUFArchitecture

_SUFFIXES = (".weight", ".bias")
# Tensors that configure the model rather than hold a parameter (llama.cpp's RoPE factors).
ROPE_FACTOR_TENSORS = frozenset(
    {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
)


def gguf_name_map(
    arch: GGUFArchitecture, parameter_names: list[str], num_layers: int
) -> dict[str, str]:
    """GGUF tensor name → mlx-lm parameter path for every parameter gguf-py can name.

    Args:
        arch: the file's architecture.
        parameter_names: the mlx-lm model's parameter paths (`tree_flatten` of its
            parameters), `.weight` / `.bias` suffixed.
        num_layers: the decoder's layer count.

    Returns:
        The GGUF names of the parameters gguf-py maps; callers report the rest.
    """
    tensor_map = gguf.get_tensor_name_map(_model_arch(arch.name), num_layers)
    names = {}
    for path in parameter_names:
        key = path
        for mlx_fragment, hf_fragment in arch.name_aliases:
            key = key.replace(mlx_fragment, hf_fragment)
        if arch.rename_parameter is not None:
            key = arch.rename_parameter(key)
        gguf_name = tensor_map.get_name(key, try_suffixes=_SUFFIXES)
        if gguf_name is None:
            continue
        names[gguf_name] = path
        # gguf-py leaves the suffix off a few names: those of parameters without one (RWKV's
        # `k_k`, to which its converter adds `.weight`) and those from a key that spells it
        # out (Falcon-H1's `pre_ff_layernorm.weight`, which llama.cpp reads with one).
        if not gguf_name.endswith(_SUFFIXES):
            names[gguf_name + (".bias" if path.endswith(".bias") else ".weight")] = path
    return names


def _model_arch(name: str) -> gguf.MODEL_ARCH:
    return next(arch for arch, arch_name in gguf.MODEL_ARCH_NAMES.items() if arch_name == name)
