"""Llama family (MaxText's `decoder_block: "llama2"`): grouped-query attention, every layer a dense SwiGLU MLP.

Real flavors carry MaxText's model configs (`configs/models/llama2-7b.yml`, `llama3-8b.yml`; Llama 3 uses the
same decoder block as Llama 2) and MaxText's default batch (12 sequences of 2048 tokens per device). No
layer has experts: `num_experts` is 0.
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
}
