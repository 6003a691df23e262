"""A mixture of experts written in shard_map: the experts split over an `expert` axis, every device computing
its own experts' share of each token's output. The shares must be summed over the axis (`psum`);
`make_step_without_psum` forgets to, so each device keeps only its own experts' share.

`shardscope verify --step tests/data/verify/moe_psum.py:make_step` passes; `…:make_step_without_psum` does not.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

TOKENS, MODEL, HIDDEN, EXPERTS = 32, 16, 32, 8


def _arguments(mesh: Mesh) -> tuple:
    """Parameters and a batch from a fixed seed, placed on the mesh: the same numbers on any mesh."""
    rng = np.random.default_rng(0)
    params = {
        "router": rng.normal(0, 0.3, (MODEL, EXPERTS)).astype(np.float32),
        "w_in": rng.normal(0, 0.3, (EXPERTS, MODEL, HIDDEN)).astype(np.float32),
        "w_out": rng.normal(0, 0.3, (EXPERTS, HIDDEN, MODEL)).astype(np.float32),
    }
    specs = {"router": P(), "w_in": P("expert"), "w_out": P("expert")}
    x = rng.normal(0, 1, (TOKENS, MODEL)).astype(np.float32)
    y = rng.normal(0, 1, (TOKENS, MODEL)).astype(np.float32)
    placed = {name: jax.device_put(value, NamedSharding(mesh, specs[name])) for name, value in params.items()}
    replicated = NamedSharding(mesh, P())
    return placed, jax.device_put(x, replicated), jax.device_put(y, replicated)


def _build(devices, sum_shares: bool):
    mesh = Mesh(np.array(devices), ("expert",))

    @functools.partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=(P(), P(None, "expert"), P("expert"), P("expert")),
        out_specs=P(),
        check_vma=False,
    )
    def experts(x, gates, w_in, w_out):
        # This device's experts, each weighted by its gate: a share of every token's output.
        hidden = jax.nn.relu(jnp.einsum("td,edh->eth", x, w_in))
        share = jnp.einsum("eth,ehd,te->td", hidden, w_out, gates)
        return jax.lax.psum(share, "expert") if sum_shares else share

    def loss_fn(params, x, y):
        gates = jax.nn.softmax(x @ params["router"], axis=-1)
        out = experts(x, gates, params["w_in"], params["w_out"])
        return jnp.mean((out - y) ** 2)

    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return {"loss": loss, "grads": grads}

    return jax.jit(step), _arguments(mesh), mesh


def make_step(devices):
    """The experts' shares summed over the expert axis."""
    return _build(devices, sum_shares=True)


def make_step_without_psum(devices):
    """The bug: the shares are never summed."""
    return _build(devices, sum_shares=False)
