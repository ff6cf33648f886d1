"""More tiny mlx-lm families written as llama.cpp's converter writes them, beside
`gguf_models.FAMILIES`; the tensor rewrites some of them need are in `gguf_conversions`."""

from __future__ import annotations

import gguf

from gguf_conversions import (
    add_expert_bias,
    add_nextn_layer,
    drop_xielu,
    permute_xverse,
    split_neox_qkv,
    split_query_key_value,
    split_wqkv,
    unshuffle_plamo,
    xielu_metadata,
)
from gguf_models import ConvertedFamily, tiny_config

_RMS = {"layer_norm_rms_eps": 1e-5}
_SWITCH = (("switch_mlp", "experts"),)

MORE_FAMILIES = {
    "phi": ConvertedFamily(
        "phi2",
        tiny_config("phi", num_key_value_heads=4, partial_rotary_factor=0.5, layer_norm_eps=1e-5),
        {"layer_norm_eps": 1e-5, "head_count_kv": 4, "rope_dimension_count": 8},
    ),
    "olmoe": ConvertedFamily(
        "olmoe",
        tiny_config("olmoe", num_experts=4, num_experts_per_tok=2, norm_topk_prob=False),
        _RMS | {"expert_count": 4, "expert_used_count": 2},
        name_aliases=_SWITCH,
    ),
    "seed_oss": ConvertedFamily(
        "seed_oss", tiny_config("seed_oss", attention_bias=True, attention_out_bias=True), _RMS
    ),
    "ernie4_5": ConvertedFamily("ernie4_5", tiny_config("ernie4_5", use_bias=True), _RMS),
    "exaone4": ConvertedFamily(
        "exaone4",
        tiny_config(
            "exaone4",
            num_hidden_layers=4,
            sliding_window=128,
            sliding_window_pattern="LLLG",
            rope_scaling=None,
        ),
        _RMS | {"sliding_window": 128, "sliding_window_pattern": [True, True, True, False]},
    ),
    "hunyuan_v1_dense": ConvertedFamily(
        "hunyuan-dense", tiny_config("hunyuan_v1_dense", use_qk_norm=True), _RMS
    ),
    "dots1": ConvertedFamily(
        "dots1",
        tiny_config(
            "dots1",
            num_hidden_layers=3,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.0,
            norm_topk_prob=True,
        ),
        _RMS
        | {
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "leading_dense_block_count": 1,
            "expert_shared_count": 1,
            "expert_weights_scale": 2.0,
            "expert_weights_norm": True,
        },
        name_aliases=(*_SWITCH, ("e_score_correction_bias", "e_score_correction.bias")),
    ),
    "apertus": ConvertedFamily(
        "apertus",
        tiny_config("apertus", mlp_bias=False, attention_bias=False, post_norm=False, qk_norm=True),
        _RMS,
        split_tensor=drop_xielu,
        weight_metadata=xielu_metadata,
    ),
    "plamo": ConvertedFamily(
        "plamo",
        tiny_config("plamo", n_shared_head=2),
        _RMS,
        split_tensor=unshuffle_plamo,
    ),
    "internlm2": ConvertedFamily(
        "internlm2", tiny_config("internlm2", bias=True), _RMS, split_tensor=split_wqkv
    ),
    # Llama 4's attention temperature grows every 8 positions, within the test's prompt.
    "ministral3": ConvertedFamily(
        "mistral3",
        tiny_config(
            "ministral3",
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 8,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "llama_4_scaling_beta": 0.1,
            },
        ),
        _RMS
        | {
            "rope_scaling_type": gguf.RopeScalingType.YARN,
            "rope_scaling_factor": 4.0,
            "rope_scaling_orig_ctx_len": 8,
            "rope_scaling_yarn_beta_fast": 32.0,
            "rope_scaling_yarn_beta_slow": 1.0,
            "rope_scaling_yarn_log_mul": 1.0,
            "attn_temperature_scale": 0.1,
        },
        rope_permuted=True,
    ),
    "mistral3_as_llama": ConvertedFamily(
        "mistral3", tiny_config("llama"), _RMS, rope_permuted=True
    ),
    "glm4_moe": ConvertedFamily(
        "glm4moe",
        tiny_config(
            "glm4_moe",
            num_hidden_layers=3,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.0,
            norm_topk_prob=True,
            n_group=1,
            topk_group=1,
            use_qk_norm=True,
            attention_bias=True,
            partial_rotary_factor=0.5,
            rope_scaling=None,
        ),
        _RMS
        | {
            "block_count": 4,
            "nextn_predict_layers": 1,
            "rope_dimension_count": 8,
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "leading_dense_block_count": 1,
            "expert_shared_count": 1,
            "expert_weights_scale": 2.0,
            "expert_weights_norm": True,
            "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
        },
        name_aliases=(*_SWITCH, ("e_score_correction_bias", "e_score_correction.bias")),
        split_tensor=add_nextn_layer,
    ),
    "deepseek": ConvertedFamily(
        "deepseek",
        tiny_config(
            "deepseek",
            num_hidden_layers=3,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
        ),
        _RMS
        | {
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "expert_shared_count": 1,
            "leading_dense_block_count": 1,
            "rope_dimension_count": 16,
        },
        rope_permuted=True,
        name_aliases=_SWITCH,
    ),
    "nemotron": ConvertedFamily(
        "nemotron",
        tiny_config("nemotron", hidden_act="relu2", partial_rotary_factor=0.5, norm_eps=1e-5),
        {"layer_norm_eps": 1e-5, "rope_dimension_count": 8},
        norm_offset=1.0,
    ),
    "minicpm": ConvertedFamily(
        "minicpm",
        tiny_config("minicpm", dim_model_base=32, scale_depth=1.4, scale_emb=12.0),
        _RMS | {"embedding_scale": 12.0, "residual_scale": 1.4 / 2**0.5, "logit_scale": 2.0},
        rope_permuted=True,
    ),
    "hunyuan": ConvertedFamily(
        "hunyuan-moe",
        tiny_config(
            "hunyuan",
            num_experts=4,
            moe_topk=2,
            moe_intermediate_size=32,
            num_shared_expert=1,
            use_mixed_mlp_moe=True,
            use_qk_norm=True,
            use_cla=False,
            cla_share_factor=1,
            attention_bias=False,
            rope_scaling={"type": "dynamic", "alpha": 1.0, "factor": 1.0},
        ),
        _RMS
        | {
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "expert_shared_count": 1,
            "expert_shared_feed_forward_length": 96,
        },
        name_aliases=_SWITCH,
    ),
    "ernie4_5_moe": ConvertedFamily(
        "ernie4_5-moe",
        tiny_config(
            "ernie4_5_moe",
            num_hidden_layers=3,
            use_bias=False,
            moe_num_experts=4,
            moe_k=2,
            moe_intermediate_size=32,
            moe_layer_start_index=1,
            moe_num_shared_experts=1,
        ),
        _RMS
        | {
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "leading_dense_block_count": 1,
            "interleave_moe_layer_step": 1,
            "expert_shared_count": 1,
        },
        name_aliases=_SWITCH,
        split_tensor=add_expert_bias,
    ),
    "gpt2": ConvertedFamily(
        "gpt2",
        tiny_config(
            "gpt2",
            num_key_value_heads=4,
            intermediate_size=256,
            n_ctx=256,
            n_embd=64,
            n_head=4,
            n_layer=2,
            n_positions=256,
            layer_norm_epsilon=1e-5,
            tie_word_embeddings=True,
        ),
        {"layer_norm_eps": 1e-5, "head_count_kv": 4},
        name_aliases=(("model.", "transformer."),),
    ),
    "gpt_bigcode": ConvertedFamily(
        "starcoder",
        tiny_config(
            "gpt_bigcode",
            num_key_value_heads=1,
            intermediate_size=256,
            n_embd=64,
            n_inner=256,
            n_head=4,
            n_layer=2,
            n_positions=256,
            layer_norm_epsilon=1e-5,
            multi_query=True,
        ),
        {"layer_norm_eps": 1e-5, "head_count_kv": 1},
    ),
    "gpt_neox": ConvertedFamily(
        "gptneox",
        tiny_config(
            "gpt_neox",
            num_key_value_heads=4,
            intermediate_size=256,
            rotary_emb_base=10000.0,
            rotary_pct=0.25,
            use_parallel_residual=True,
            layer_norm_eps=1e-5,
        ),
        {"layer_norm_eps": 1e-5, "rope_dimension_count": 4, "parallel_residual": True},
        name_aliases=(
            ("model.embed_out", "embed_out"),
            ("model.h.", "gpt_neox.layers."),
            ("model.", "gpt_neox."),
        ),
        split_tensor=split_neox_qkv,
    ),
    "exaone_moe": ConvertedFamily(
        "exaone-moe",
        tiny_config(
            "exaone_moe",
            num_hidden_layers=3,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            num_shared_experts=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            sliding_window=128,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            is_moe_layer=[False, True, True],
        ),
        _RMS
        | {
            "block_count": 4,
            "nextn_predict_layers": 1,
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "expert_shared_count": 1,
            "expert_shared_feed_forward_length": 32,
            "expert_weights_scale": 2.5,
            "expert_weights_norm": True,
            "leading_dense_block_count": 1,
            "sliding_window": 128,
            "sliding_window_pattern": [True, True, False, True],
        },
        name_aliases=(*_SWITCH, ("e_score_correction_bias", "e_score_correction.bias")),
        split_tensor=add_nextn_layer,
    ),
    "qwen": ConvertedFamily(
        "qwen",
        tiny_config(
            "qwen",
            num_key_value_heads=4,
            kv_channels=16,
            layer_norm_epsilon=1e-5,
            intermediate_size=192,
            no_bias=True,
        ),
        _RMS | {"head_count_kv": 4},
        name_aliases=(("model.", "transformer."),),
    ),
    "bailing_moe": ConvertedFamily(
        "bailingmoe",
        tiny_config(
            "bailing_moe",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            num_shared_experts=1,
            norm_topk_prob=True,
            first_k_dense_replace=0,
            use_qkv_bias=False,
            n_group=1,
            topk_group=1,
        ),
        _RMS
        | {
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "expert_shared_count": 1,
            "expert_weights_scale": 1.0,
            "expert_weights_norm": True,
            "leading_dense_block_count": 0,
            "rope_dimension_count": 16,
        },
        name_aliases=(*_SWITCH, ("gate.gate_proj", "gate")),
        split_tensor=split_query_key_value,
    ),
    "minimax": ConvertedFamily(
        "minimax-m2",
        tiny_config(
            "minimax",
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=0,
            rotary_dim=8,
            use_qk_norm=True,
            scoring_func="sigmoid",
        ),
        _RMS
        | {
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 96,
            "rope_dimension_count": 8,
        },
        name_aliases=(
            ("switch_mlp.gate_proj", "experts.w1"),
            ("switch_mlp.down_proj", "experts.w2"),
            ("switch_mlp.up_proj", "experts.w3"),
            ("e_score_correction_bias", "e_score_correction.bias"),
        ),
    ),
    "gptj": ConvertedFamily(
        "gptj",
        tiny_config(
            "gptj",
            num_key_value_heads=4,
            intermediate_size=256,
            n_embd=64,
            n_head=4,
            n_layer=2,
            n_positions=256,
            rotary_dim=8,
            layer_norm_epsilon=1e-5,
        ),
        {"layer_norm_eps": 1e-5, "head_count_kv": 4, "rope_dimension_count": 8},
        name_aliases=(("model.", "transformer."),),
    ),
    # Eight query heads over two KV heads: XVERSE permutes the keys in four groups.
    "xverse": ConvertedFamily(
        "xverse",
        tiny_config("llama", num_attention_heads=8, num_key_value_heads=2, head_dim=8),
        _RMS,
        split_tensor=permute_xverse,
    ),
}
