"""Attention as MaxText's TPU kernel runs it (`attention=flash`): the same function as plain causal attention,
the blocks above the diagonal never computed, and no [seq × seq] tensor kept for the backward pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardscope
from reference_models.flash_stand_in import blockwise_causal_attention, causal_attention

# The quick lane (`-m "not slow"`) leaves these out: attention run and differentiated over several block sizes.
pytestmark = pytest.mark.slow


def _qkv(heads=4, kv_heads=2, seq=64, dim=8, v_dim=8):
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, seq, heads, dim))
    k = jax.random.normal(keys[1], (2, seq, kv_heads, dim))
    v = jax.random.normal(keys[2], (2, seq, kv_heads, v_dim))
    return q, k, v


@pytest.mark.parametrize(("block", "fused"), [(8, False), (16, False), (64, False), (16, True)])
def test_blockwise_is_causal_attention_values_and_gradients(block, fused):
    q, k, v = _qkv(v_dim=12)  # MLA's values are narrower or wider than its keys

    def loss(f):
        return lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))

    plain = loss(lambda q, k, v: causal_attention(q, k, v, 0.3))
    blocked = loss(lambda q, k, v: blockwise_causal_attention(q, k, v, 0.3, block, fused))
    np.testing.assert_allclose(blocked(q, k, v), plain(q, k, v), rtol=1e-5)
    for got, want in zip(jax.grad(blocked, (0, 1, 2))(q, k, v), jax.grad(plain, (0, 1, 2))(q, k, v), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_blocks_above_the_diagonal_are_not_computed():
    q, k, v = _qkv(seq=256)

    def flops(f):
        return jax.jit(f).lower(q, k, v).compile().cost_analysis()["flops"]

    plain = flops(lambda q, k, v: causal_attention(q, k, v, 0.3))
    blocked = flops(lambda q, k, v: blockwise_causal_attention(q, k, v, 0.3, 32))
    # 8 blocks: the row of block i sees i + 1 key blocks, 36 of 64 block pairs (the diagonal included).
    assert blocked / plain == pytest.approx(36 / 64, rel=0.05)


def test_no_seq_by_seq_tensor_is_kept_for_the_backward_pass():
    def temp(kernel):
        settings = {"model.seq_len": "256", "model.remat": "none", "model.attention_kernel": kernel}
        settings["model.attention_block"] = "32"
        plan = shardscope.plan_case("mixtral-tiny", settings=settings, use_cache=False)
        return dict(plan.memory)["temp_bytes"]

    dot, flash = temp("dot_product"), temp("flash")
    # Without remat, dot_product keeps every layer's float32 probabilities [batch, heads, seq, seq]: 4 layers
    # × 8 sequences × 4 heads × 256² × 4 bytes / 8 devices = 4 MiB per device; flash keeps none of them.
    kept_scores = 4 * 8 * 4 * 256 * 256 * 4 // 8
    assert dot - flash >= 0.9 * kept_scores, (dot, flash, kept_scores)


def test_the_stand_ins_scopes_are_the_kernel_markers_the_cost_model_reads():
    # The reference models spell shardscope's kernel-marker protocol by name (they import nothing of it).
    import shardscope.kernels
    from reference_models.config import GROUPED_SCOPE
    from reference_models.flash_stand_in import FLASH_SCOPE, OFF_DIAGONAL_SCOPE

    assert (FLASH_SCOPE, OFF_DIAGONAL_SCOPE, GROUPED_SCOPE) == (
        shardscope.kernels.ATTENTION,
        shardscope.kernels.HALF_VISITED,
        shardscope.kernels.GROUPED_MATMUL,
    )


@pytest.mark.parametrize(("axis_type", "block", "fused"), [("Auto", 8, False), ("Explicit", 16, True)])
def test_the_stand_in_over_a_split_sequence_is_causal_attention(axis_type, block, fused):
    # Context parallelism on any compiler: each device keeps its queries and gathers the keys and values inside
    # a shard_map, as the TPU kernel's all-gather strategy does. Values and gradients equal the reference.
    from jax.sharding import NamedSharding, PartitionSpec

    from reference_models.flash_stand_in import context_parallel_stand_in

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices")
    kind = getattr(jax.sharding.AxisType, axis_type)
    mesh = jax.make_mesh((2, 4), ("data", "context"), devices=jax.devices()[:8], axis_types=(kind, kind))
    whole = _qkv(v_dim=12)
    q, k, v = (jax.device_put(x, NamedSharding(mesh, PartitionSpec("data", "context"))) for x in whole)

    def split(q, k, v):
        spec = ("data", "context", None)
        return context_parallel_stand_in(q, k, v, mesh=mesh, spec=spec, scale=0.3, block=block, fused_backward=fused)

    def loss(f):
        return lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))

    out = jax.jit(split)(q, k, v)
    assert out.sharding.spec[:2] == ("data", "context")
    np.testing.assert_allclose(out, causal_attention(*whole, 0.3), rtol=1e-5, atol=1e-5)
    plain = loss(lambda q, k, v: causal_attention(q, k, v, 0.3))
    grads = jax.jit(jax.grad(loss(split), (0, 1, 2)))(q, k, v)
    for got, want in zip(grads, jax.grad(plain, (0, 1, 2))(*whole), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
