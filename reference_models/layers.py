"""Shared layers with MaxText's parameter names and logical axes: DenseGeneral (`kernel`), RMSNorm
(`scale`), the token embedding (`embedding`), the SwiGLU MLP block (`wi_0`, `wi_1`, `wo`) and rotary
embeddings."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from reference_models.config import DecoderConfig
from reference_models.sharding import constrain, current_context, entry_axes

_INIT = nn.initializers.normal(stddev=0.02)

# MaxText's `MlpBlock` intermediate activation ("linears/x" in its sharding dump).
MLP_INTERMEDIATE = ("activation_batch", "activation_length", "activation_mlp")


# The dtype parameters are created in: the model's `weight_dtype`, set for the whole model by `weights_in`
# (layers deep inside it have no config to read it from).
_WEIGHT_DTYPE: contextvars.ContextVar[str] = contextvars.ContextVar("weight_dtype", default="float32")


@contextlib.contextmanager
def weights_in(dtype: str) -> Iterator[None]:
    """Parameters created inside are of `dtype` (MaxText's `weight_dtype`)."""
    token = _WEIGHT_DTYPE.set(dtype)
    try:
        yield
    finally:
        _WEIGHT_DTYPE.reset(token)


def logical_param(module: nn.Module, name: str, shape: Sequence[int], logical: Sequence[str | None], init=_INIT) -> Any:
    """A parameter (of the model's weight dtype) carrying one logical axis name per dimension."""
    dtype = jnp.dtype(_WEIGHT_DTYPE.get())
    return module.param(name, nn.with_logical_partitioning(init, tuple(logical)), tuple(shape), dtype)


class DenseGeneral(nn.Module):
    """Contracts the last `contract` dims of the input with a `kernel` of logical axes `logical`."""

    features: tuple[int, ...]
    logical: tuple[str | None, ...]
    contract: int = 1
    dtype: str = "float32"
    # With Explicit axes, the logical axes the result is placed on by the matmul itself (MaxText's
    # `out_sharding` of the output head): the matmul then runs on that split of the batch, not the input's.
    out_logical: tuple[str | None, ...] | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        in_shape = x.shape[x.ndim - self.contract :]
        kernel = logical_param(self, "kernel", (*in_shape, *self.features), self.logical)
        lhs = tuple(range(x.ndim - self.contract, x.ndim))
        rhs = tuple(range(self.contract))
        dims = ((lhs, rhs), ((), ()))
        context = current_context()
        if context is not None and context.explicit:
            # Explicit axes need the result's sharding spelled out when the kernel is sharded (FSDP) on
            # axes the activation's batch already uses: the kernel is then gathered, as FSDP does.
            if self.out_logical is not None:
                out = context.resolve(self.out_logical)
            else:
                out = _explicit_out_spec(x, kernel, self.contract)
            return jax.lax.dot_general(x.astype(self.dtype), kernel.astype(self.dtype), dims, out_sharding=out)
        return jax.lax.dot_general(x.astype(self.dtype), kernel.astype(self.dtype), dims)


def _explicit_out_spec(x: jax.Array, kernel: jax.Array, contract: int) -> jax.sharding.PartitionSpec:
    """x's sharding on its kept dims, then the kernel's feature-dim sharding minus axes x already uses."""
    kept = jax.typeof(x).sharding.spec.partitions[: x.ndim - contract]
    kept = kept + (None,) * (x.ndim - contract - len(kept))
    used = {axis for entry in kept for axis in entry_axes(entry)}
    features = []
    for entry in jax.typeof(kernel).sharding.spec.partitions[contract:] + (None,) * kernel.ndim:
        free = tuple(axis for axis in entry_axes(entry) if axis not in used)
        used.update(free)
        features.append(free if len(free) > 1 else (free[0] if free else None))
    return jax.sharding.PartitionSpec(*kept, *features[: kernel.ndim - contract])


def like(x: jax.Array, reference: jax.Array) -> jax.Array:
    """`x` on `reference`'s sharding: with Explicit axes, arrays joined together must agree on it."""
    context = current_context()
    if context is None or not context.explicit:
        return x
    return jax.sharding.reshard(x, jax.typeof(reference).sharding.spec)


def explicit_spec(logical: Sequence[str | None]) -> jax.sharding.PartitionSpec | None:
    """With Explicit mesh axes, the spec an op's ambiguous result is given (MaxText's `out_sharding`);
    None otherwise (with Auto axes MaxText leaves such results to the compiler)."""
    context = current_context()
    return context.resolve(logical) if context is not None and context.explicit else None


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned `scale` (logical axis `norm`)."""

    eps: float = 1e-6

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = logical_param(self, "scale", (x.shape[-1],), ("norm",), nn.initializers.ones)
        context = current_context()
        if context is not None and context.explicit and jax.typeof(scale).sharding.spec.partitions not in ((), (None,)):
            # A scale sharded over an axis the batch also uses (llama2-7b's `norm` on fsdp) cannot broadcast
            # onto the activations with Explicit axes; MaxText's einsum with the activations' out_sharding
            # gathers it, as this does.
            scale = jax.sharding.reshard(scale, jax.sharding.PartitionSpec(None))
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if context is not None and context.explicit and jax.typeof(scale).sharding.spec.reduced:
            # A scale marked reduced (a pipeline's gathered-once weights) may not meet activations split
            # over the axes it is reduced on elementwise; MaxText's norm is an einsum, which may.
            out = jax.typeof(x).sharding.spec
            return jnp.einsum("...k,k->...k", normed.astype(x.dtype), scale.astype(x.dtype), out_sharding=out)
        return (normed * scale).astype(x.dtype)


class Embed(nn.Module):
    """Token embedding: an `embedding` table [vocab, embed] (logical `vocab`, `embed_vocab`)."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.config
        table = logical_param(self, "embedding", (cfg.vocab_size, cfg.embed_dim), ("vocab", "embed_vocab"))
        out = explicit_spec(("activation_embed_and_logits_batch", "activation_length", "activation_embed"))
        if cfg.iota_embed:
            # MaxText's `use_iota_embed`: the lookup as a matmul of the tokens' one-hot rows with the table (in
            # the activation dtype), which runs on the matrix units, its backward pass a second matmul.
            one_hot = (tokens[..., None] == jax.lax.iota(jnp.int32, cfg.vocab_size)).astype(cfg.dtype)
            return jnp.dot(one_hot, table.astype(cfg.dtype), out_sharding=out)
        # MaxText casts the table to the activation dtype before the lookup, so the table's gradient is
        # scattered and summed in that dtype (half the bytes of a float32 gradient), then cast once.
        return table.astype(cfg.dtype).at[tokens].get(out_sharding=out)


class MlpBlock(nn.Module):
    """SwiGLU MLP (dense layers and shared experts): `wi_0`, `wi_1` [embed, mlp], `wo` [mlp, embed]."""

    config: DecoderConfig
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = self.config.dtype
        # Named as MaxText names them, for the remat policies (reference_models/remat.py).
        gate = DenseGeneral((self.hidden,), ("embed", "mlp"), dtype=dtype, name="wi_0")(x)
        up = DenseGeneral((self.hidden,), ("embed", "mlp"), dtype=dtype, name="wi_1")(x)
        gate, up = checkpoint_name(gate, "mlpwi_0"), checkpoint_name(up, "mlpwi_1")
        intermediate = constrain(self.path, "x", nn.silu(gate) * up, MLP_INTERMEDIATE)
        out = DenseGeneral((x.shape[-1],), ("mlp", "embed"), dtype=dtype, name="wo")(intermediate)
        return checkpoint_name(out, "mlpwo")


def apply_rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding over the last dimension of [batch, seq, heads, dim]."""
    dim = x.shape[-1]
    positions = jnp.arange(x.shape[1], dtype=jnp.float32)
    freqs = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = positions[:, None] * freqs[None, :]
    sin = jnp.sin(angles)[None, :, None, :].astype(x.dtype)
    cos = jnp.cos(angles)[None, :, None, :].astype(x.dtype)
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
