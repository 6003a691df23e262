"""A ring of experts in shard_map: the batch split over `data` × `fsdp`, each batch shard's tokens split over
`expert`. Every device gathers its shard's tokens over `expert`, runs its own experts on all of them, and
reduce-scatters the partial outputs back over `expert` (each device keeping its own tokens' sums).
`make_step_scattering_over_fsdp` reduce-scatters over `fsdp`, an axis of the same size: the shapes agree, the
sums mix tokens of different sequences.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH, TOKENS, MODEL, HIDDEN, EXPERTS = 4, 16, 16, 32, 4
BATCH_AXES = ("data", "fsdp")


def _arguments(mesh: Mesh) -> tuple:
    """Parameters and a batch from a fixed seed, placed on the mesh: the same numbers on any mesh."""
    rng = np.random.default_rng(1)
    params = {
        "router": rng.normal(0, 0.3, (MODEL, EXPERTS)).astype(np.float32),
        "w_in": rng.normal(0, 0.3, (EXPERTS, MODEL, HIDDEN)).astype(np.float32),
        "w_out": rng.normal(0, 0.3, (EXPERTS, HIDDEN, MODEL)).astype(np.float32),
    }
    specs = {"router": P(), "w_in": P("expert"), "w_out": P("expert")}
    x = rng.normal(0, 1, (BATCH, TOKENS, MODEL)).astype(np.float32)
    y = rng.normal(0, 1, (BATCH, TOKENS, MODEL)).astype(np.float32)
    placed = {name: jax.device_put(value, NamedSharding(mesh, specs[name])) for name, value in params.items()}
    tokens = NamedSharding(mesh, P(BATCH_AXES, "expert"))
    return placed, jax.device_put(x, tokens), jax.device_put(y, tokens)


def _build(devices, scatter_axis: str):
    sides = 2 if len(devices) == 8 else 1
    mesh = Mesh(np.array(devices).reshape(sides, sides, sides), ("data", "fsdp", "expert"))

    @functools.partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=(P(BATCH_AXES, "expert"), P(), P("expert"), P("expert")),
        out_specs=P(BATCH_AXES, "expert"),
        check_vma=False,
    )
    def ring(x, router, w_in, w_out):
        tokens = jax.lax.all_gather(x, "expert", axis=1, tiled=True)  # this batch shard's every token
        gates = jax.nn.softmax(tokens @ router, axis=-1)
        index = jax.lax.axis_index("expert")
        mine = jax.lax.dynamic_slice_in_dim(gates, index * w_in.shape[0], w_in.shape[0], axis=2)
        hidden = jax.nn.relu(jnp.einsum("btd,edh->ebth", tokens, w_in))
        partial = jnp.einsum("ebth,ehd,bte->btd", hidden, w_out, mine)
        return jax.lax.psum_scatter(partial, scatter_axis, scatter_dimension=1, tiled=True)

    def loss_fn(params, x, y):
        out = ring(x, params["router"], params["w_in"], params["w_out"])
        return jnp.mean((out - y) ** 2)

    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return {"loss": loss, "grads": grads}

    return jax.jit(step), _arguments(mesh), mesh


def make_step(devices):
    """The partial outputs reduce-scattered over the axis the experts are split over."""
    return _build(devices, scatter_axis="expert")


def make_step_scattering_over_fsdp(devices):
    """The bug: reduce-scattered over `fsdp` instead."""
    return _build(devices, scatter_axis="fsdp")
