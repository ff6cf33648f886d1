"""GGUF architectures whose layers mix attention kinds: sliding and global attention of
different sizes (MiMo-V2-Flash, Step 3.5). `gguf_architectures` adds them to its table.
"""

from __future__ import annotations

from mlxcel_models.loading.gguf_architecture import GGUFArchitecture
from mlxcel_models.loading.gguf_hybrid import hybrid_base_config
from mlxcel_models.loading.gguf_local_global import (
    install_step3p5_rope_factors,
    mimo_v2_flash,
    step3p5,
)

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
)
