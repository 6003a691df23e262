"""A plain Flax model planned by shardscope: `shardscope dump --step examples/mlp_step.py:make_step`.

A two-layer MLP trained with Adam, its hidden dimension split over a `model` axis (tensor parallelism) and
its batch over a `data` axis. `make_step(devices)` is the whole protocol: build the mesh from the devices
shardscope passes in, and return the jitted step, its (abstract) arguments and the mesh.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH, FEATURES, HIDDEN, OUT = 32, 128, 512, 64


class MLP(nn.Module):
    """x → Dense(HIDDEN) → gelu → Dense(OUT)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(HIDDEN, name="up")(x)
        return nn.Dense(OUT, name="down")(nn.gelu(x))


# Tensor parallelism: `up` is split by its output columns, `down` by its input rows, so the hidden
# activation never needs gathering; the batch is split over `data`.
TENSOR_PARALLEL = {
    "up": {"kernel": P(None, "model"), "bias": P("model")},
    "down": {"kernel": P("model", None), "bias": P()},
}
REPLICATED = {"up": {"kernel": P(), "bias": P()}, "down": {"kernel": P(), "bias": P()}}


def make_step(devices, param_specs=None):
    """The jitted train step, its abstract arguments and its mesh (data × model = 4 × 2 on 8 devices)."""
    specs = TENSOR_PARALLEL if param_specs is None else param_specs
    mesh = Mesh(np.array(devices).reshape(len(devices) // 2, 2), ("data", "model"))
    model, optimizer = MLP(), optax.adam(1e-3)

    def loss_fn(params, x, y):
        return jnp.mean((model.apply({"params": params}, x) - y) ** 2)

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    x = jax.ShapeDtypeStruct((BATCH, FEATURES), jnp.float32)
    y = jax.ShapeDtypeStruct((BATCH, OUT), jnp.float32)
    params = jax.eval_shape(model.init, jax.random.key(0), x)["params"]
    opt_state = jax.eval_shape(optimizer.init, params)
    param_sharding = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)
    # Adam's moments follow their parameters; its step count is replicated.
    opt_sharding = jax.tree.map(lambda _: NamedSharding(mesh, P()), opt_state)
    opt_sharding = (opt_sharding[0]._replace(mu=param_sharding, nu=param_sharding), opt_sharding[1])
    batch = NamedSharding(mesh, P("data"))
    step = jax.jit(
        train_step,
        in_shardings=(param_sharding, opt_sharding, batch, batch),
        out_shardings=(param_sharding, opt_sharding, NamedSharding(mesh, P())),
        donate_argnums=(0, 1),
    )
    return step, (params, opt_state, x, y), mesh


def make_replicated_step(devices):
    """The same step with every parameter replicated (plain data parallelism), to diff against."""
    return make_step(devices, REPLICATED)
