"""A pipeline in shard_map: four layers, one a stage over a `stage` axis, the batch over `data`. Each
iteration every stage runs its layer and hands its activation to the next stage (`ppermute`, stage s to
s + 1); after as many iterations as stages the last stage holds the output. `make_step_sending_backwards`
hands activations to stage s − 1: every permutation is valid, the layers run in the wrong order on the
wrong inputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

LAYERS, BATCH, MODEL = 4, 8, 16


def _arguments(mesh: Mesh) -> tuple:
    """Parameters and a batch from a fixed seed, placed on the mesh: the same numbers on any mesh."""
    rng = np.random.default_rng(2)
    weights = rng.normal(0, 0.5, (LAYERS, MODEL, MODEL)).astype(np.float32)
    x = rng.normal(0, 1, (BATCH, MODEL)).astype(np.float32)
    y = rng.normal(0, 1, (BATCH, MODEL)).astype(np.float32)
    batch = NamedSharding(mesh, P("data"))
    return jax.device_put(weights, NamedSharding(mesh, P("stage"))), jax.device_put(x, batch), jax.device_put(y, batch)


def _build(devices, shift: int):
    stages = 4 if len(devices) == 8 else 1
    mesh = Mesh(np.array(devices).reshape(stages, len(devices) // stages), ("stage", "data"))

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("stage"), P("data")), out_specs=P("data"), check_vma=False)
    def pipeline(weights, x):
        count = jax.lax.axis_size("stage")
        index = jax.lax.axis_index("stage")
        state = jnp.where(index == 0, x, jnp.zeros_like(x))  # the input enters at the first stage
        for iteration in range(count):
            for layer in weights:  # this stage's layers (all of them on one device)
                state = jnp.tanh(state @ layer)
            if iteration < count - 1:
                perm = [(s, (s + shift) % count) for s in range(count)]
                state = jax.lax.ppermute(state, "stage", perm)
        # The last stage's activation is the output: every stage gets it.
        return jax.lax.psum(jnp.where(index == count - 1, state, jnp.zeros_like(state)), "stage")

    def loss_fn(weights, x, y):
        return jnp.mean((pipeline(weights, x) - y) ** 2)

    def step(weights, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(weights, x, y)
        return {"loss": loss, "grads": grads}

    return jax.jit(step), _arguments(mesh), mesh


def make_step(devices):
    """Each stage hands its activation to the next one."""
    return _build(devices, shift=1)


def make_step_sending_backwards(devices):
    """The bug: each stage hands its activation to the one before."""
    return _build(devices, shift=-1)
