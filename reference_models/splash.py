"""Causal attention on a TPU as MaxText runs it there: JAX's Pallas splash-attention kernel.

MaxText's `attention=flash` (and `autoselected`, on TPU) calls the splash kernel inside a shard_map over the
axes that split the batch and the heads (`attention_op.py: tpu_flash_attention`). The kernel keeps each
[query block × key block] tile of scores in the core's vector memory, never in HBM, and its backward pass
recomputes them; so the compiled step holds no score tensor at all, and the TPU compiler's memory figures
are those of MaxText's step. A stand-in in plain JAX (`flash_stand_in.py`) cannot do
that: however it is blocked, the compiler writes its scores to HBM and may keep several blocks alive at
once (DeepSeek-V3 at 8k tokens: over 100 GB of them per device).

A sequence split over mesh axes (context parallelism) runs as MaxText's default strategy does
(`context_parallel_strategy=all_gather`): each device keeps its own queries, the keys and values are
gathered whole, and the kernel runs its shard of the causal mask (`q_seq_shards`). MaxText also reorders
the tokens so that every shard holds an early and a late chunk (`context_parallel_load_balance`), which
evens the kernel's work across devices; the reference models keep the order (the mask is the plain causal
one, the same function), and the cost model prices the kernel's blocks as the balanced shards visit them.

Only a compile for a TPU can lower the kernel; elsewhere (`None`) the stand-in runs, as it does where the
kernel's shard_map would not be MaxText's (a head dimension split over a mesh axis) or where its blocks do
not tile the sequence.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from reference_models.config import DecoderConfig
from reference_models.flash_stand_in import attention_split
from reference_models.sharding import (
    ambient_mesh,
    current_context,
    entry_axes,
    is_explicit,
    named_on,
    place,
)

_LANES = 128  # a TPU vector register's lanes: the kernel's blocks are multiples of it


def splash_attention(
    config: DecoderConfig, q: jax.Array, k: jax.Array, v: jax.Array, scale: float, logical: tuple[str, ...]
) -> jax.Array | None:
    """Causal attention of q [batch, seq, heads, dim] over k, v (as many or fewer heads) by the splash
    kernel, split as `logical` places q, k and v; None where the kernel does not run (see the module)."""
    context = current_context()
    if context is None or context.platform != "tpu":
        return None
    split = attention_split(context, logical)
    if split is None:
        return None
    batch, length, heads, shards = split
    seq = q.shape[1]
    blocks = {name: min(size, seq) for name, size in config.splash_block_sizes.items()}
    if any(seq % size or size % _LANES or (seq // shards) % size for size in blocks.values()):
        # MaxText pads the sequence to whole blocks; the reference models do not. The kernel's blocks are
        # whole vector lanes (sequences shorter than one lane: the tiny models), and tile each shard.
        return None
    fused_backward = config.attention_fused_backward
    if shards > 1:
        return context_parallel_splash(
            q,
            k,
            v,
            mesh=ambient_mesh(context),
            spec=(batch, length, heads),
            scale=scale,
            blocks=blocks,
            fused_backward=fused_backward,
        )
    outer = PartitionSpec(batch, None, heads, None)
    run = functools.partial(local_splash_attention, scale=scale, blocks=blocks, fused_backward=fused_backward)
    if context.explicit:
        q, k, v = (place(context, x, outer) for x in (q, k, v))
    sharded = jax.shard_map(run, mesh=ambient_mesh(context), in_specs=(outer,) * 3, out_specs=outer, check_vma=False)
    return sharded(q, k, v)


def context_parallel_splash(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mesh: jax.sharding.Mesh | None,
    spec: tuple[Any, ...],
    scale: float,
    blocks: dict[str, int],
    fused_backward: bool,
    interpret: bool = False,
) -> jax.Array:
    """The kernel over queries split along the sequence (`spec`: the mesh axes of q's batch, length and
    heads): MaxText's all-gather strategy. The kernel is made for the whole causal mask, cut into as many
    query shards as the sequence has, and its mask metadata goes into the shard_map split as the queries
    are, so that each device runs its own rows of the mask. The keys and values enter split and are
    gathered inside it: a remat policy that saves them (`key_proj`, `value_proj`) then keeps them split, and
    the backward pass gathers them again and reduce-scatters their gradients. (Gathered at the shard_map's
    edge instead, the compiler kept the gathered copy of every layer: 35 GiB more per device for Llama 3.1
    70B at 128k tokens.) `mesh` None: the ambient one (while tracing under `jax.set_mesh`)."""
    batch, length, heads = spec
    sizes = (mesh or jax.sharding.get_abstract_mesh()).shape
    kernel = _causal_kernel(
        q.shape[1],
        q.shape[2],
        blocks,
        fused_backward,
        interpret,
        head_shards=math.prod(sizes[axis] for axis in entry_axes(heads)),
        q_seq_shards=math.prod(sizes[axis] for axis in entry_axes(length)),
    )
    metadata = kernel.manual_sharding_spec(named_on(mesh, PartitionSpec(heads, length)))
    queries = PartitionSpec(batch, length, heads, None)
    if is_explicit(mesh or jax.sharding.get_abstract_mesh()):
        # With explicit axes a shard_map takes its inputs as their types place them: they (and the kernel's
        # metadata, made whole on every device) are moved first, as MaxText does.
        kernel = jax.tree.map(
            lambda array, split: array if split is None else jax.sharding.reshard(array, named_on(mesh, split)),
            kernel,
            metadata,
            is_leaf=lambda x: x is None,
        )
        q, k, v = (jax.sharding.reshard(x, named_on(mesh, queries)) for x in (q, k, v))

    def run(kernel: Any, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        k, v = (jax.lax.all_gather(x, entry_axes(length), axis=1, tiled=True) for x in (k, v))
        return _run_kernel(kernel, q, k, v, scale)

    sharded = jax.shard_map(
        run, mesh=mesh, in_specs=(metadata, queries, queries, queries), out_specs=queries, check_vma=False
    )
    return sharded(kernel, q, k, v)


def _causal_kernel(
    seq: int,
    heads: int,
    blocks: dict[str, int],
    fused_backward: bool,
    interpret: bool,
    head_shards: int = 1,
    q_seq_shards: int = 1,
) -> Any:
    """The splash kernel of a causal mask over `seq` tokens and `heads` heads, tiled as `blocks` say (the
    fused backward kernel has no query-gradient blocks of its own), its mask cut into the given shards."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    sizes: dict[str, Any] = {
        f"block_{name}": size for name, size in blocks.items() if not (fused_backward and name.endswith("_dq"))
    }
    return kernel_lib.make_splash_mha(
        mask_lib.MultiHeadMask([mask_lib.CausalMask((seq, seq))] * heads),
        block_sizes=kernel_lib.BlockSizes(**sizes, use_fused_bwd_kernel=fused_backward),
        head_shards=head_shards,
        q_seq_shards=q_seq_shards,
        # MaxText names the kernel's residuals as the attention result, for its remat policies.
        residual_checkpoint_name="context",
        interpret=interpret,
    )


def _run_kernel(kernel: Any, q: jax.Array, k: jax.Array, v: jax.Array, scale: float) -> jax.Array:
    """The kernel over q [batch, seq, heads, dim], k and v: it takes [heads, seq, dim] per sequence and does
    not scale the queries."""
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in ((q * scale).astype(q.dtype), k, v))
    return jnp.swapaxes(jax.vmap(kernel)(q, k, v), 1, 2)


def local_splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float,
    blocks: dict[str, int],
    fused_backward: bool,
    interpret: bool = False,
) -> jax.Array:
    """The kernel on one device's q [batch, seq, heads, dim], k and v: causal, queries scaled by `scale`.
    `interpret` runs the kernel in Pallas' interpreter (any backend; for tests)."""
    kernel = _causal_kernel(q.shape[1], q.shape[2], blocks, fused_backward, interpret)
    return _run_kernel(kernel, q, k, v, scale)
