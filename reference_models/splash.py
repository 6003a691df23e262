"""Causal attention on a TPU as MaxText runs it there: JAX's Pallas splash-attention kernel.

MaxText's `attention=flash` (and `autoselected`, on TPU) calls the splash kernel inside a shard_map over the
axes that split the batch and the heads (`attention_op.py: tpu_flash_attention`). The kernel keeps each
[query block × key block] tile of scores in the core's vector memory, never in HBM, and its backward pass
recomputes them; so the compiled step holds no score tensor at all, and the TPU compiler's memory figures
are those of MaxText's step. A stand-in in plain JAX (`attention.blockwise_causal_attention`) cannot do
that: however it is blocked, the compiler writes its scores to HBM and may keep several blocks alive at
once (DeepSeek-V3 at 8k tokens: over 100 GB of them per device).

Only a compile for a TPU can lower the kernel; elsewhere (`None`) the stand-in runs, as it does where the
kernel's shard_map would not be MaxText's (a sequence split over a mesh axis, which MaxText runs with ring
or all-gather variants; a head dimension split over one) or where its blocks do not tile the sequence.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from reference_models.config import DecoderConfig
from reference_models.sharding import ambient_mesh, current_context, entry_axes, place

_LANES = 128  # a TPU vector register's lanes: the kernel's blocks are multiples of it


def splash_attention(
    config: DecoderConfig, q: jax.Array, k: jax.Array, v: jax.Array, scale: float, logical: tuple[str, ...]
) -> jax.Array | None:
    """Causal attention of q [batch, seq, heads, dim] over k, v (as many or fewer heads) by the splash
    kernel, split as `logical` places q, k and v; None where the kernel does not run (see the module)."""
    context = current_context()
    if context is None or context.platform != "tpu":
        return None
    spec = tuple(context.resolve(logical)) + (None,) * 4
    batch, length, heads, dim = spec[:4]
    sizes = context.mesh.shape
    if any(sizes[axis] > 1 for axis in (*entry_axes(length), *entry_axes(dim))):
        return None
    seq = q.shape[1]
    blocks = {name: min(size, seq) for name, size in config.splash_block_sizes.items()}
    if any(seq % size or size % _LANES for size in blocks.values()):
        # MaxText pads the sequence to whole blocks; the reference models do not. The kernel's blocks are
        # whole vector lanes (sequences shorter than one lane: the tiny models).
        return None
    outer = PartitionSpec(batch, None, heads, None)
    run = functools.partial(
        local_splash_attention,
        scale=scale,
        blocks=blocks,
        fused_backward=config.attention_fused_backward,
    )
    if context.explicit:
        q, k, v = (place(context, x, outer) for x in (q, k, v))
    sharded = jax.shard_map(run, mesh=ambient_mesh(context), in_specs=(outer,) * 3, out_specs=outer, check_vma=False)
    return sharded(q, k, v)


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
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    # The fused backward kernel has no query-gradient blocks of its own.
    sizes: dict[str, Any] = {
        f"block_{name}": size for name, size in blocks.items() if not (fused_backward and name.endswith("_dq"))
    }
    block_sizes = kernel_lib.BlockSizes(**sizes, use_fused_bwd_kernel=fused_backward)
    seq = q.shape[1]
    # The kernel takes [heads, seq, dim] per sequence and does not scale the queries.
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in ((q * scale).astype(q.dtype), k, v))
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((seq, seq))] * q.shape[1])
    kernel = kernel_lib.make_splash_mha(
        mask,
        block_sizes=block_sizes,
        head_shards=1,
        q_seq_shards=1,
        # MaxText names the kernel's residuals as the attention result, for its remat policies.
        residual_checkpoint_name="context",
        interpret=interpret,
    )
    return jnp.swapaxes(jax.vmap(kernel)(q, k, v), 1, 2)
