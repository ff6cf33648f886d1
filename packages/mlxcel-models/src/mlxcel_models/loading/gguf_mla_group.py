"""GGUF architectures of DeepSeek-style latent attention beyond DeepSeek's own (GLM-5's
sparse attention, Mistral 4) and BitNet's ternary layers, for `gguf_architectures`."""

from __future__ import annotations

from mlxcel_models.loading.gguf_architecture import GGUFArchitecture
from mlxcel_models.loading.gguf_bitnet import BITLINEAR_WEIGHTS, BITNET_SUB_NORMS, bitnet_config
from mlxcel_models.loading.gguf_mla_variants import (
    LATENT_AND_FUSED_EXPERTS,
    glm_dsa_config,
    mistral4_config,
)

# mlx-lm stacks the experts as `switch_mlp`; the converter names the stack `experts`.
_SWITCH = ("switch_mlp", "experts")
# The converter renames the router's `e_score_correction_bias` to a bias.
_EXPERT_BIAS = ("e_score_correction_bias", "e_score_correction.bias")

MLA_GROUP_ARCHITECTURES = (
    GGUFArchitecture(
        "glm-dsa",
        "glm_moe_dsa",
        name_aliases=(_SWITCH, _EXPERT_BIAS),
        extras=glm_dsa_config,
        tensor_join=LATENT_AND_FUSED_EXPERTS,
    ),
    # The converter keeps Mistral 4's fused expert `gate_up_proj` (ffn_gate_up_exps), as
    # its `--fuse-gate-up-exps` writes GLM-5's.
    GGUFArchitecture(
        "mistral4",
        "mistral4",
        name_aliases=(_SWITCH,),
        extras=mistral4_config,
        tensor_join=LATENT_AND_FUSED_EXPERTS,
    ),
    # Ternary matrices stored as 0 / ±scale floats (or TQ blocks), packed for BitLinear.
    GGUFArchitecture(
        "bitnet",
        "bitnet",
        name_aliases=BITNET_SUB_NORMS,
        extras=bitnet_config,
        tensor_join=BITLINEAR_WEIGHTS,
    ),
)
