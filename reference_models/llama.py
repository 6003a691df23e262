"""Llama family (MaxText's `decoder_block: "llama2"`): grouped-query attention, every layer a dense SwiGLU MLP.

Real flavors carry MaxText's model configs (`configs/models/llama2-7b.yml`, `llama2-70b.yml`, `llama3-8b.yml`,
`llama3.1-8b.yml`, `llama3.1-70b.yml`, `llama3.1-405b.yml`; Llama 3 and 3.1 use the same decoder block as
Llama 2) and MaxText's default batch (12 sequences of 2048 tokens per device). No layer has experts:
`num_experts` is 0.

What the ymls say that is not modelled here, none of which changes a shape or a sharding: MaxText runs every
`llama3.1-*` model (by its model_name) with Llama 3.1's scaled rotary frequencies (`LLaMARotaryEmbedding`,
base.yml's `rope_use_scale: true`); the rotary embedding here is plain RoPE at the yml's timescale.
llama2-70b.yml does not set `enable_dropout: false` (base.yml: true), but base.yml's `dropout_rate` is 0.0.
"""

from __future__ import annotations

from typing import Any

from reference_models.config import DecoderConfig

# MaxText's `normalization_layer_epsilon: 1.0e-5` (both ymls) and base.yml's `rope_max_timescale: 10_000`.
_COMMON: dict[str, Any] = dict(family="llama", attention="gqa", norm_epsilon=1e-5, rope_theta=10000.0)
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
        mlp_dim=128,
        seq_len=32,
        global_batch=8,
    ),
    # Llama 2 7B: multi-head attention (as many key/value heads as query heads); its yml also moves the norm
    # scales onto fsdp under MaxText's default rules.
    "2-7b": DecoderConfig(
        **_COMMON,
        logical_axis_rules=(("norm", ("fsdp",)),),
        vocab_size=32000,
        embed_dim=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        mlp_dim=11008,
        dtype="bfloat16",
        **_MAXTEXT_BATCH,
    ),
    # Llama 2 70B: grouped-query attention (8 key/value heads for 64 query heads); the norm rule of 7B.
    "2-70b": DecoderConfig(
        **_COMMON,
        logical_axis_rules=(("norm", ("fsdp",)),),
        vocab_size=32000,
        embed_dim=8192,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=28672,
        dtype="bfloat16",
        **_MAXTEXT_BATCH,
    ),
    # Llama 3 8B: 8 key/value heads, a 128K vocabulary, `rope_max_timescale: 500_000`.
    "3-8b": DecoderConfig(
        **{**_COMMON, "rope_theta": 500000.0},
        vocab_size=128256,
        embed_dim=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14336,
        dtype="bfloat16",
        **_MAXTEXT_BATCH,
    ),
    # Llama 3.1 (8B, 70B, 405B): 8 key/value heads, a 128K vocabulary, `rope_max_timescale: 500_000`; 3.1-8b's
    # shapes are 3-8b's.
    "3.1-8b": DecoderConfig(
        **{**_COMMON, "rope_theta": 500000.0},
        vocab_size=128256,
        embed_dim=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14336,
        dtype="bfloat16",
        **_MAXTEXT_BATCH,
    ),
    "3.1-70b": DecoderConfig(
        **{**_COMMON, "rope_theta": 500000.0},
        vocab_size=128256,
        embed_dim=8192,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=28672,
        dtype="bfloat16",
        **_MAXTEXT_BATCH,
    ),
    "3.1-405b": DecoderConfig(
        **{**_COMMON, "rope_theta": 500000.0},
        vocab_size=128256,
        embed_dim=16384,
        num_layers=126,
        num_heads=128,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=53248,
        dtype="bfloat16",
        **_MAXTEXT_BATCH,
    ),
}
