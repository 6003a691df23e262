"""MaxText's dense MoE (`sparse_matmul=false` with a capacity factor): each sequence's tokens dispatched to
per-expert slots by one-hot einsums, choices beyond a sequence's capacity dropped, as `generate_masks` does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_loss import assert_same_step, real_state_and_batch, single_device_step

from reference_models.moe import ExpertLayout, all_to_all_body, ring_body, row_capacity

# The quick lane (`-m "not slow"`) leaves these out: sharded MoE steps run against the same step on one device.
pytestmark = pytest.mark.slow

EXPERTS, K, EMBED, HIDDEN = 4, 2, 8, 16


def _inputs(batch: int = 3, seq: int = 10):
    keys = jax.random.split(jax.random.key(1), 6)
    x = jax.random.normal(keys[0], (batch, seq, EMBED), jnp.float32)
    logits = jax.random.normal(keys[1], (batch, seq, EXPERTS), jnp.float32)
    top, ids = jax.lax.top_k(logits, K)
    weights = jax.nn.softmax(top, axis=-1)
    wi_0 = jax.random.normal(keys[2], (EXPERTS, EMBED, HIDDEN), jnp.float32) / 4
    wi_1 = jax.random.normal(keys[3], (EXPERTS, EMBED, HIDDEN), jnp.float32) / 4
    wo = jax.random.normal(keys[4], (EXPERTS, HIDDEN, EMBED), jnp.float32) / 4
    return x, weights, ids, wi_0, wi_1, wo


def _by_loops(x, weights, ids, wi_0, wi_1, wo, capacity):
    """The MoE written out per sequence: choices taken in (token, choice) order, an expert's beyond
    `capacity` in that sequence dropped."""
    x, weights, ids = np.asarray(x), np.asarray(weights), np.asarray(ids)
    wi_0, wi_1, wo = np.asarray(wi_0), np.asarray(wi_1), np.asarray(wo)
    out = np.zeros_like(x)
    for b in range(x.shape[0]):
        taken = [0] * EXPERTS
        for s in range(x.shape[1]):
            for c in range(K):
                e = int(ids[b, s, c])
                taken[e] += 1
                if taken[e] > capacity:
                    continue
                gate, up = x[b, s] @ wi_0[e], x[b, s] @ wi_1[e]
                hidden = gate / (1 + np.exp(-gate)) * up
                out[b, s] += weights[b, s, c] * (hidden @ wo[e])
    return out


@pytest.mark.parametrize("factor", [0.5, 1.0, 4.0])
def test_dense_dispatch_drops_beyond_each_sequences_capacity(factor):
    args = _inputs()
    capacity = row_capacity(args[0].shape[1], K, EXPERTS, factor)
    layout = ExpertLayout(EXPERTS, factor)
    got = all_to_all_body(*args, layout=layout)
    want = _by_loops(*args, capacity)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    if factor == 0.5:  # the test must see drops: some choices beyond capacity
        assert not np.allclose(want, _by_loops(*args, capacity=10 * K))


def test_row_capacity_is_maxtexts():
    # int(max(ceil(seq * k / experts) * factor, factor)): Mixtral-8x22B's run, 4,096 tokens, top-2 of 8, 1.25.
    assert row_capacity(4096, 2, 8, 1.25) == 1280
    assert row_capacity(3, 1, 8, 1.5) == 1  # ceil(3 / 8) = 1, × 1.5, truncated
    assert row_capacity(10, 2, 4, 0.5) == 2


def test_ring_of_experts_on_one_device_is_the_same_block():
    # The ring's body restricted to all experts (one device): the same dense dispatch and combine.
    args = _inputs()
    layout = ExpertLayout(EXPERTS, 0.5, ep_axes=("expert",), ep_sizes=(1,))
    mesh = jax.make_mesh((1,), ("expert",), devices=jax.devices()[:1])
    spec = jax.sharding.PartitionSpec()
    run = jax.shard_map(
        lambda *a: ring_body(*a, layout=layout), mesh=mesh, in_specs=(spec,) * 6, out_specs=spec, check_vma=False
    )
    got = run(*args)
    want = _by_loops(*args, row_capacity(args[0].shape[1], K, EXPERTS, 0.5))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", ["default", "ep-tp"])
def test_sharded_dense_moe_equals_single_device(preset, compiled_cases):
    # Sequences stay whole on a device, so each one's capacity and drops are the same sharded or not.
    step = compiled_cases("mixtral-tiny", preset, **{"model.capacity_factor": "0.5"})
    state, batch = real_state_and_batch(step.case)
    assert_same_step(step, state, batch, single_device_step(step.case, state, batch))
