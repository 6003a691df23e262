"""Mixtral family: grouped-query attention, every layer a top-2 MoE, no shared experts.

Real flavors carry MaxText's model configs (`configs/models/mixtral-8x7b.yml`, `mixtral-8x22b.yml`) and
MaxText's default batch (12 sequences of 2048 tokens per device).
"""

from __future__ import annotations

from typing import Any

from reference_models.config import DecoderConfig

_COMMON: dict[str, Any] = dict(
    family="mixtral", attention="gqa", router="topk_softmax", num_experts_per_token=2, rope_theta=1e6, norm_epsilon=1e-5
)
_MAXTEXT_BATCH: dict[str, Any] = dict(seq_len=2048, per_device_batch=12)

FLAVORS: dict[str, DecoderConfig] = {
    # Small enough that a sharded train step compiles in a second or two on a laptop.
    "tiny": DecoderConfig(
        **_COMMON,
        vocab_size=256,
        embed_dim=64,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        num_experts=8,
        moe_mlp_dim=64,
        seq_len=32,
        global_batch=8,
    ),
    "8x7b": DecoderConfig(
        **_COMMON,
        vocab_size=32000,
        embed_dim=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        num_experts=8,
        moe_mlp_dim=14336,
        capacity_factor=1.25,
        dtype="bfloat16",
        **_MAXTEXT_BATCH,
    ),
    "8x22b": DecoderConfig(
        **_COMMON,
        vocab_size=32768,
        embed_dim=6144,
        num_layers=56,
        num_heads=48,
        num_kv_heads=8,
        head_dim=128,
        num_experts=8,
        moe_mlp_dim=16384,
        capacity_factor=1.25,
        dtype="bfloat16",
        **_MAXTEXT_BATCH,
    ),
}
