"""Data parallelism written by hand in shard_map: the batch split over `data`, each device computing the
loss and gradients of its own shard, then averaging both over the axis (`pmean`) before an SGD update.
`make_step_without_grad_allreduce` averages the loss but not the gradients: the loss it reports is right,
each device updates the parameters with its own shard's gradients.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH, FEATURES, HIDDEN = 64, 16, 32
LEARNING_RATE = 0.1


def _arguments(mesh: Mesh) -> tuple:
    """Parameters and a batch from a fixed seed, placed on the mesh: the same numbers on any mesh."""
    rng = np.random.default_rng(3)
    params = {
        "w1": rng.normal(0, 0.3, (FEATURES, HIDDEN)).astype(np.float32),
        "w2": rng.normal(0, 0.3, (HIDDEN, 1)).astype(np.float32),
    }
    x = rng.normal(0, 1, (BATCH, FEATURES)).astype(np.float32)
    y = rng.normal(0, 1, (BATCH, 1)).astype(np.float32)
    replicated, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    return jax.device_put(params, replicated), jax.device_put(x, batch), jax.device_put(y, batch)


def _build(devices, reduce_grads: bool):
    mesh = Mesh(np.array(devices), ("data",))

    def loss_fn(params, x, y):
        return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)

    @functools.partial(
        jax.shard_map, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()), check_vma=False
    )
    def loss_and_grads(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)  # this device's shard of the batch
        if reduce_grads:
            grads = jax.lax.pmean(grads, "data")
        return jax.lax.pmean(loss, "data"), grads

    def step(params, x, y):
        loss, grads = loss_and_grads(params, x, y)
        params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
        return {"loss": loss, "grads": grads, "params": params}

    return jax.jit(step), _arguments(mesh), mesh


def make_step(devices):
    """Loss and gradients averaged over the data axis."""
    return _build(devices, reduce_grads=True)


def make_step_without_grad_allreduce(devices):
    """The bug: only the loss is averaged."""
    return _build(devices, reduce_grads=False)
