"""GGUF architectures whose layers are of mixed kinds: sliding and global attention of
different sizes (MiMo-V2-Flash, Step 3.5), Kimi delta attention and latent attention
(Kimi Linear), Mamba and attention under PLaMo's own names (PLaMo 2). `gguf_architectures`
adds them to its table.
"""

from __future__ import annotations

from mlxcel_models.loading.gguf_architecture import GGUFArchitecture
from mlxcel_models.loading.gguf_hybrid import hybrid_base_config
from mlxcel_models.loading.gguf_kimi_linear import (
    KDA_RESHAPED,
    KIMI_LATENT_ATTENTION,
    kimi_linear,
)
from mlxcel_models.loading.gguf_local_global import (
    install_step3p5_rope_factors,
    mimo_v2_flash,
    step3p5,
)
from mlxcel_models.loading.gguf_plamo2 import plamo2, restore_plamo2_tensor
from mlxcel_models.loading.gguf_recurrent import SSM_RESHAPED, restore_ssm_decay

MORE_ARCHITECTURES = (
    # The converter renames the router's `e_score_correction_bias` to a bias; mlx-lm
    # stacks the experts as `switch_mlp`.
    GGUFArchitecture(
        "mimo2",
        "mimo_v2_flash",
        name_aliases=(
            ("switch_mlp", "experts"),
            ("e_score_correction_bias", "e_score_correction.bias"),
        ),
        base_config=hybrid_base_config,
        extras=mimo_v2_flash,
    ),
    # Step 3.5's checkpoint keeps its experts under `moe` and the shared expert beside the
    # MLP, and the converter makes the router's bias a bias; it adds the norms' offset of
    # one to the stored weights, as mlx-lm's sanitize does.
    GGUFArchitecture(
        "step35",
        "step3p5",
        name_aliases=(
            ("mlp.switch_mlp.", "moe."),
            ("mlp.gate.gate.", "moe.gate."),
            ("mlp.gate.router_bias", "moe.router_bias.bias"),
            ("mlp.share_expert.", "share_expert."),
        ),
        base_config=hybrid_base_config,
        extras=step3p5,
        install_rope_factors=install_step3p5_rope_factors,
    ),
    # mlx-lm keeps Kimi Linear's experts under `mlp` (the checkpoint under
    # `block_sparse_moe`) and its router bias beside the router; the converter names the
    # KDA convolutions `*_conv1d` and `dt_bias` a time-step projection's bias.
    GGUFArchitecture(
        "kimi-linear",
        "kimi_linear",
        name_aliases=(
            ("switch_mlp", "experts"),
            ("mlp.e_score_correction_bias", "mlp.gate.e_score_correction.bias"),
            ("_conv.conv.", "_conv1d."),
            ("self_attn.dt_bias", "self_attn.dt_proj.bias"),
        ),
        base_config=hybrid_base_config,
        extras=kimi_linear,
        tensor_join=KIMI_LATENT_ATTENTION,
        restore_tensor=restore_ssm_decay,
        reshaped_tensors=KDA_RESHAPED,
    ),
    # PLaMo 2's Mamba norms, Q/K norm weights and time-step bias are parameters of the mixer
    # without a `.weight` of their own in mlx-lm; the converter gives them one (and the
    # time-step bias the name of a projection's bias).
    GGUFArchitecture(
        "plamo2",
        "plamo2",
        name_aliases=(
            ("mixer.dt_bias", "mixer.dt_proj.bias"),
            ("_norm_weight", "_norm.weight"),
            ("mixer.q_weight", "mixer.q.weight"),
            ("mixer.k_weight", "mixer.k.weight"),
        ),
        base_config=hybrid_base_config,
        extras=plamo2,
        restore_tensor=restore_plamo2_tensor,
        reshaped_tensors=SSM_RESHAPED,
    ),
)
