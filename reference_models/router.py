"""The router of MaxText's routed experts (`layers/moe.py`): the gate's projection and the top-k expert choice."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from reference_models.config import DecoderConfig
from reference_models.layers import logical_param


def route(
    gate_logits: jax.Array, pre_bias_logits: jax.Array | None, k: int, router: str
) -> tuple[jax.Array, jax.Array]:
    """Top-k expert choice per token: (weights [..., k] float32, expert ids [..., k])."""
    logits = gate_logits.astype(jnp.float32)
    if router == "topk_softmax":
        top, ids = jax.lax.top_k(logits, k)
        return jax.nn.softmax(top, axis=-1), ids
    if router == "sigmoid_bias":
        # The biased scores choose the experts; the unbiased scores weight them.
        assert pre_bias_logits is not None
        _, ids = jax.lax.top_k(logits, k)
        top = jnp.take_along_axis(pre_bias_logits.astype(jnp.float32), ids, axis=-1)
        return top / jnp.sum(top, axis=-1, keepdims=True), ids
    probs = jax.nn.softmax(logits, axis=-1)
    top, ids = jax.lax.top_k(probs, k)
    return top / jnp.sum(top, axis=-1, keepdims=True), ids


class GateLogit(nn.Module):
    """The router's projection: a `kernel` [embed, experts] and, for DeepSeek-V3, a `bias` [experts].

    Returns (gate logits, pre-bias logits); the second is None unless the router has a bias.
    """

    config: DecoderConfig
    logical: tuple[str | None, ...]

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        cfg = self.config
        kernel = logical_param(self, "kernel", (x.shape[-1], cfg.num_experts), self.logical)
        logits = jnp.einsum("bse,ex->bsx", x, kernel.astype(x.dtype))
        if not cfg.routed_bias:
            return logits, None
        scores = jax.nn.sigmoid(logits)
        bias = logical_param(self, "bias", (cfg.num_experts,), self.logical[-1:], nn.initializers.zeros)
        return scores + bias.astype(scores.dtype), scores
