"""DeepSeek family: MLA attention, first layers dense, then shared + top-k routed experts.

Real flavors carry MaxText's model configs (`configs/models/deepseek2-16b.yml`, `deepseek3-671b.yml`) and
MaxText's default batch (`per_device_batch_size: 12`, `max_target_length: 2048`), so that a plan of the
same case has the shapes MaxText's own sharding dump has. The tiny flavor has DeepSeek-V3's structure
(low-rank queries, a biased sigmoid router) at sizes that compile in a second or two.
"""

from __future__ import annotations

from typing import Any

from reference_models.config import DecoderConfig

_COMMON: dict[str, Any] = dict(family="deepseek", attention="mla", norm_epsilon=1e-6)
# MaxText's default batch: 12 sequences of 2048 tokens per device.
_MAXTEXT_BATCH: dict[str, Any] = dict(seq_len=2048, per_device_batch=12)

FLAVORS: dict[str, DecoderConfig] = {
    # Small enough that a sharded train step compiles in a second or two on a laptop.
    "tiny": DecoderConfig(
        **_COMMON,
        vocab_size=256,
        embed_dim=64,
        num_layers=5,
        first_dense_layers=1,
        num_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        mlp_dim=128,
        num_experts=8,
        num_experts_per_token=2,
        moe_mlp_dim=32,
        num_shared_experts=1,
        router="sigmoid_bias",
        seq_len=32,
        global_batch=8,
    ),
    # DeepSeek-V2-Lite (16B): no low-rank query projection.
    "16b": DecoderConfig(
        **_COMMON,
        vocab_size=102400,
        embed_dim=2048,
        num_layers=27,
        first_dense_layers=1,
        num_heads=16,
        q_lora_rank=0,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        mlp_dim=10944,
        num_experts=64,
        num_experts_per_token=6,
        moe_mlp_dim=1408,
        num_shared_experts=2,
        router="softmax_topk",
        capacity_factor=1.25,
        dtype="bfloat16",
        **_MAXTEXT_BATCH,
    ),
    # DeepSeek-V3 (671B).
    "671b": DecoderConfig(
        **_COMMON,
        vocab_size=129280,
        embed_dim=7168,
        num_layers=61,
        first_dense_layers=3,
        num_heads=128,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        mlp_dim=18432,
        num_experts=256,
        num_experts_per_token=8,
        moe_mlp_dim=2048,
        num_shared_experts=1,
        router="sigmoid_bias",
        capacity_factor=1.25,
        dtype="bfloat16",
        **_MAXTEXT_BATCH,
    ),
}
