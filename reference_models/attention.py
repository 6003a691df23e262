"""Attention as MaxText writes it: grouped-query attention (`attentions.py`, Mixtral) and multi-head latent
attention (`attention_mla.py`, DeepSeek), with MaxText's parameter names, logical axes and activation
constraints (each constraint is named after the variable MaxText constrains)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from reference_models.config import DecoderConfig
from reference_models.flash_stand_in import (
    FLASH_SCOPE,
    blockwise_causal_attention,
    causal_attention,
    sequence_parallel_stand_in,
)
from reference_models.layers import DenseGeneral, RMSNorm, apply_rope, like
from reference_models.sharding import constrain
from reference_models.splash import splash_attention

# Grouped-query attention (attentions.py defaults).
GQA_INPUT = ("activation_batch_attn", "activation_input_length_attn", "activation_embed_attn")
GQA_QKV = ("activation_kv_batch", "activation_length_attn", "activation_kv_heads", "activation_kv_head_dim")
GQA_OUT = ("activation_batch_attn", "activation_length_attn", "activation_heads", "activation_kv")
# Multi-head latent attention (attention_mla.py defaults).
MLA_INPUT = ("activation_batch_attn", "activation_length", "activation_embed")
MLA_QKV = ("activation_kv_batch", "activation_length", "activation_kv_heads", "activation_kv_head_dim")
MLA_OUT = ("activation_batch_attn", "activation_length", "activation_heads", "activation_kv")


def attention_core(
    config: DecoderConfig, q: jax.Array, k: jax.Array, v: jax.Array, scale: float, logical: tuple[str, ...]
) -> jax.Array:
    """The attention computation MaxText's `attention` setting picks (`config.attention_kernel`): with flash,
    on a TPU the splash kernel itself (`splash.py`; q, k and v split as `logical` places them), elsewhere a
    stand-in that does the kernel's work (`flash_stand_in.py`). Both name their residuals (the output and
    its log-sum-exp) "context", as MaxText runs the kernel; naming the output again would keep a second
    copy under a policy that saves the context."""
    if config.uses_flash_attention:
        kernel = splash_attention(config, q, k, v, scale, logical)
        if kernel is not None:
            return kernel
        # The scope names the stand-in's ops in the compiled program, so the cost model prices them as the
        # kernel runs (scores kept on chip), not as the stand-in's fusions.
        with jax.named_scope(FLASH_SCOPE):
            split = sequence_parallel_stand_in(config, q, k, v, scale, logical)
            if split is not None:
                return split
            return blockwise_causal_attention(q, k, v, scale, config.attention_block, config.attention_fused_backward)
    return checkpoint_name(causal_attention(q, k, v, scale), "context")


def _named_qkv(query: jax.Array, key: jax.Array, value: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The projections under MaxText's names, for the remat policies (reference_models/remat.py)."""
    return checkpoint_name(query, "query_proj"), checkpoint_name(key, "key_proj"), checkpoint_name(value, "value_proj")


class Attention(nn.Module):
    """Grouped-query attention (Mixtral): rotary q/k, fewer key/value heads than query heads."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array) -> jax.Array:
        cfg = self.config
        inputs_q = constrain(self.path, "inputs_q", inputs_q, GQA_INPUT)
        inputs_kv = constrain(self.path, "inputs_kv", inputs_kv, GQA_INPUT)
        query = DenseGeneral((cfg.num_heads, cfg.head_dim), ("embed", "q_heads", "kv"), dtype=cfg.dtype, name="query")(
            inputs_q
        )
        kv_shape, kv_logical = (cfg.num_kv_heads, cfg.head_dim), ("embed", "kv_heads", "kv_head_dim")
        key = DenseGeneral(kv_shape, kv_logical, dtype=cfg.dtype, name="key")(inputs_kv)
        value = DenseGeneral(kv_shape, kv_logical, dtype=cfg.dtype, name="value")(inputs_kv)
        query = constrain(self.path, "query", apply_rope(query, cfg.rope_theta), GQA_QKV)
        key = constrain(self.path, "key", apply_rope(key, cfg.rope_theta), GQA_QKV)
        value = constrain(self.path, "value", value, GQA_QKV)
        query, key, value = _named_qkv(query, key, value)
        out = attention_core(cfg, query, key, value, cfg.head_dim**-0.5, GQA_QKV)
        out = constrain(self.path, "out", checkpoint_name(out, "attention_out"), GQA_OUT)
        out = DenseGeneral((cfg.embed_dim,), ("heads", "kv", "embed"), contract=2, dtype=cfg.dtype, name="out")(out)
        return checkpoint_name(out, "out_proj")


class MLA(nn.Module):
    """DeepSeek multi-head latent attention: queries (optionally through a low-rank latent) and keys/values
    through a low-rank latent, each split into a rope and a no-rope part.

    `wkv_a` projects to the key/value latent and the shared rope key together (kv_lora_rank +
    qk_rope_head_dim wide, logical `kv_lora_up_proj`), as MaxText's does.
    """

    config: DecoderConfig

    @nn.compact
    def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array) -> jax.Array:
        cfg = self.config
        heads, nope, rope = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        inputs_q = constrain(self.path, "inputs_q", inputs_q, MLA_INPUT)
        inputs_kv = constrain(self.path, "inputs_kv", inputs_kv, MLA_INPUT)

        # Queries.
        if cfg.q_lora_rank:
            low_rank_q = DenseGeneral((cfg.q_lora_rank,), ("embed", "q_lora_up_proj"), dtype=cfg.dtype, name="wq_a")(
                inputs_q
            )
            low_rank_q = checkpoint_name(low_rank_q, "query_wa_proj")
            low_rank_q = checkpoint_name(RMSNorm(cfg.norm_epsilon, name="q_norm")(low_rank_q), "mla_q")
            q = DenseGeneral((heads, nope + rope), ("q_lora", "q_heads", "kv"), dtype=cfg.dtype, name="wq_b")(
                low_rank_q
            )
        else:
            q = DenseGeneral((heads, nope + rope), ("embed", "q_heads", "kv"), dtype=cfg.dtype, name="query")(inputs_q)
        q_nope, q_pe = jnp.split(q, [nope], axis=-1)
        q_nope = constrain(self.path, "q_nope", q_nope, MLA_QKV)
        q_pe = constrain(self.path, "q_pe", apply_rope(q_pe, cfg.rope_theta), MLA_QKV)
        query = constrain(self.path, "query", jnp.concatenate([q_nope, q_pe], axis=-1), MLA_QKV)

        # Keys and values.
        low_rank = DenseGeneral(
            (cfg.kv_lora_rank + rope,), ("embed", "kv_lora_up_proj"), dtype=cfg.dtype, name="wkv_a"
        )(inputs_kv)
        low_rank = checkpoint_name(low_rank, "kv_wa_proj")
        low_rank_main, low_rank_rope = jnp.split(low_rank, [cfg.kv_lora_rank], axis=-1)
        low_rank_main = checkpoint_name(RMSNorm(cfg.norm_epsilon, name="kv_norm")(low_rank_main), "mla_kv")
        # The rope part of the key is one head shared by every query head.
        key_rope = apply_rope(low_rank_rope[:, :, None, :], cfg.rope_theta)
        kv = DenseGeneral(
            (heads, nope + cfg.v_head_dim), ("kv_lora", "kv_heads", "kv_head_dim"), dtype=cfg.dtype, name="wkv_b"
        )(low_rank_main)
        key_nope, value = jnp.split(kv, [nope], axis=-1)
        key_rope = like(jnp.broadcast_to(key_rope, (*key_nope.shape[:3], rope)), key_nope)
        key_nope = constrain(self.path, "key_nope", key_nope, MLA_QKV)
        key_rope = constrain(self.path, "key_rope", key_rope, MLA_QKV)
        key = constrain(self.path, "key", jnp.concatenate([key_nope, key_rope], axis=-1), MLA_QKV)
        value = constrain(self.path, "value", value, MLA_QKV)
        query, key, value = _named_qkv(query, key, value)

        out = attention_core(cfg, query, key, value, (nope + rope) ** -0.5, MLA_QKV)
        out = constrain(self.path, "out", checkpoint_name(out, "attention_out"), MLA_OUT)
        out = DenseGeneral((cfg.embed_dim,), ("heads", "kv", "embed"), contract=2, dtype=cfg.dtype, name="out")(out)
        return checkpoint_name(out, "out_proj")
