"""Attention as MaxText writes it: grouped-query attention (`attentions.py`, Mixtral) and multi-head latent
attention (`attention_mla.py`, DeepSeek), with MaxText's parameter names, logical axes and activation
constraints (each constraint is named after the variable MaxText constrains)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from reference_models.config import DecoderConfig
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


FLASH_SCOPE = "flash_attention"  # shardscope.hlo.work.KERNEL_SCOPE names the same


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, offset: int = 0) -> jax.Array:
    """Softmax attention with a causal mask; k/v may have fewer heads than q (grouped queries). The queries
    sit at positions `offset`, `offset + 1`, … of the keys' sequence."""
    batch, seq, heads, _ = q.shape
    probs = jax.nn.softmax(_row_scores(q, k, scale, offset), axis=-1).astype(v.dtype)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v)
    return out.reshape(batch, seq, heads, v.shape[-1])


def _grouped(q: jax.Array, kv_heads: int) -> jax.Array:
    """q [batch, rows, heads, dim] as [batch, rows, kv heads, query heads per kv head, dim]."""
    batch, rows, heads, dim = q.shape
    return q.reshape(batch, rows, kv_heads, heads // kv_heads, dim)


def _causal_mask(rows: int, keys: int, first: int) -> jax.Array:
    """[rows, keys]: whether query row `first + i` may see key j."""
    return jnp.arange(rows)[:, None] + first >= jnp.arange(keys)[None, :]


def blockwise_causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: float, block: int, fused_backward: bool = False
) -> jax.Array:
    """Causal attention as a flash/splash kernel does its work: query blocks of `block` rows, each against
    the keys up to its last row only (the blocks above the diagonal are skipped, as the kernel skips them),
    and nothing of it kept for the backward pass but q, k, v, the output and its log-sum-exp. The backward
    pass is the kernel's (`_row_backward`): each block's scores recomputed, in a query-gradient pass and a
    key/value-gradient pass (or one pass, `fused_backward`), so its matmuls are the kernel's.

    The same function as `causal_attention` (tested); `block` ≥ seq is exactly it.
    """
    seq = q.shape[1]
    if block >= seq or seq % block:
        return causal_attention(q, k, v, scale)
    rows = [_row(q, k, v, scale, first, first + block, fused_backward) for first in range(0, seq, block)]
    return jnp.concatenate(rows, axis=1)


def _row_scores(q: jax.Array, k: jax.Array, scale: float, first: int) -> jax.Array:
    """Masked float32 scores [batch, kv heads, groups, rows, keys] of query rows `first`… against k."""
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", _grouped(q, k.shape[2]), k).astype(jnp.float32) * scale
    return jnp.where(_causal_mask(q.shape[1], k.shape[1], first), scores, jnp.finfo(jnp.float32).min)


def _row_forward(q, k, v, scale, first, last, fused_backward):
    # Sliced here, so the residuals are q, k and v themselves (no prefix copies), as the kernel's are.
    scores = _row_scores(q[:, first:last], k[:, :last], scale, first)
    peak = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    unnormalised = jnp.exp(scores - peak)
    total = jnp.sum(unnormalised, axis=-1, keepdims=True)
    probs = (unnormalised / total).astype(v.dtype)
    lse = peak + jnp.log(total)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v[:, :last])
    out = out.reshape(*out.shape[:2], -1, v.shape[-1])
    return out, (q, k, v, out, lse)


def _row_backward(scale, first, last, fused_backward, residuals, d_out):
    # Traced where the gradient is taken: named as the kernel's ops explicitly (see `attention_core`).
    with jax.named_scope(FLASH_SCOPE):
        return _kernel_gradients(scale, first, last, fused_backward, residuals, d_out)


def _kernel_gradients(scale, first, last, fused_backward, residuals, d_out):
    """The kernel's backward: the query gradient (scores, the probabilities' gradient, dq) and the key/value
    gradient (scores, the probabilities' gradient, dv, dk) as separate passes, each recomputing what it
    needs, or one fused pass. The key/value pass works on the transposed scores [keys × query rows], as
    the kernel's key/value-gradient loop does; written so, the compiler cannot merge its matmuls with the
    query pass's (the two kernels share none of their work)."""
    q_all, k_all, v_all, out, lse = residuals
    q, k, v = q_all[:, first:last], k_all[:, :last], v_all[:, :last]
    batch, rows = q.shape[:2]
    q_grouped, d_grouped = _grouped(q, k.shape[2]), _grouped(d_out, k.shape[2])
    groups = q_grouped.shape[3]
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    delta = delta.reshape(batch, rows, k.shape[2], groups).transpose(0, 2, 3, 1)[..., None]  # [b,h,g,q,1]

    # The query pass, over [query rows × keys]. Its scores are the queries scaled first (the kernel's
    # forward pass scales them after), so the compiler cannot take them from the rematerialised forward pass.
    scaled = (q_grouped.astype(jnp.float32) * scale).astype(q.dtype)
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", scaled, k).astype(jnp.float32)
    mask = _causal_mask(rows, k.shape[1], first)
    probs = jnp.exp(jnp.where(mask, scores, jnp.finfo(jnp.float32).min) - lse)
    d_probs = jnp.einsum("bqhgd,bkhd->bhgqk", d_grouped, v).astype(jnp.float32)
    d_scores = probs * (d_probs - delta) * scale
    dq = jnp.einsum("bhgqk,bkhd->bqhgd", d_scores.astype(q.dtype), k).reshape(q.shape)
    if fused_backward:
        dv = jnp.einsum("bhgqk,bqhgd->bkhd", probs.astype(v.dtype), d_grouped)
        dk = jnp.einsum("bhgqk,bqhgd->bkhd", d_scores.astype(k.dtype), q_grouped)
    else:
        # The key/value pass, over [keys × query rows].
        scores_t = jnp.einsum("bkhd,bqhgd->bhgkq", k, q_grouped).astype(jnp.float32) * scale
        scores_t = jnp.where(mask.T, scores_t, jnp.finfo(jnp.float32).min)
        probs_t = jnp.exp(scores_t - jnp.swapaxes(lse, -1, -2))
        d_probs_t = jnp.einsum("bkhd,bqhgd->bhgkq", v, d_grouped).astype(jnp.float32)
        d_scores_t = probs_t * (d_probs_t - jnp.swapaxes(delta, -1, -2)) * scale
        dv = jnp.einsum("bhgkq,bqhgd->bkhd", probs_t.astype(v.dtype), d_grouped)
        dk = jnp.einsum("bhgkq,bqhgd->bkhd", d_scores_t.astype(k.dtype), q_grouped)

    def padded(grad, like_all, start, stop):
        return jnp.zeros_like(like_all).at[:, start:stop].set(grad.astype(like_all.dtype))

    return padded(dq, q_all, first, last), padded(dk, k_all, 0, last), padded(dv, v_all, 0, last)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _row(q, k, v, scale, first, last, fused_backward):
    return _row_forward(q, k, v, scale, first, last, fused_backward)[0]


_row.defvjp(_row_forward, _row_backward)


def attention_core(
    config: DecoderConfig, q: jax.Array, k: jax.Array, v: jax.Array, scale: float, logical: tuple[str, ...]
) -> jax.Array:
    """The attention computation MaxText's `attention` setting picks (`config.attention_kernel`): with flash,
    on a TPU the splash kernel itself (`splash.py`; q, k and v split as `logical` places them), elsewhere a
    stand-in that does the kernel's work."""
    if config.uses_flash_attention:
        kernel = splash_attention(config, q, k, v, scale, logical)
        if kernel is not None:
            # The kernel names its own residuals (its output and log-sum-exp) "context", as MaxText runs it;
            # naming its output again would keep a second copy under a policy that saves the context.
            return kernel
        # The scope names the stand-in's ops in the compiled program, so the cost model prices them as the
        # kernel runs (scores kept on chip), not as the stand-in's fusions.
        with jax.named_scope(FLASH_SCOPE):
            out = blockwise_causal_attention(q, k, v, scale, config.attention_block, config.attention_fused_backward)
    else:
        out = causal_attention(q, k, v, scale)
    return checkpoint_name(out, "context")


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
