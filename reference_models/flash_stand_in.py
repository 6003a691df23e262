"""Causal attention as a flash kernel does its work, in plain JAX: the stand-in for MaxText's splash kernel
wherever the kernel itself cannot run (every compile but a TPU's; see splash.py).

Query blocks of `block` rows, each against the keys up to its last row only (the blocks above the diagonal
are skipped, as the kernel skips them), and nothing of it kept for the backward pass but q, k, v, the output
and its log-sum-exp (named "context", as the kernel names its residuals, so a remat policy that saves the
context keeps them and does not run the forward pass again). The backward pass is the kernel's: each block's
scores recomputed, in a query-gradient pass and a key/value-gradient pass (or one pass, `fused_backward`),
so its matmuls are the kernel's.

A sequence split over mesh axes (context parallelism) runs as the kernel does there (splash.py): each
device keeps its own queries and gathers the keys and values inside a shard_map. Its queries attend to its
own keys causally and to the other shards' keys wholly or not at all (those before it, wholly). Which shards
come before depends on the device, so that part is a matmul against every other shard's keys under a mask;
MaxText's load-balanced token order makes each device visit half of it on average, and the cost model counts
those matmuls (marked `OFF_DIAGONAL_SCOPE`, shardscope's half-visited kernel marker) at half their FLOPs.

Every op of the stand-in is marked `FLASH_SCOPE` (shardscope's attention-kernel marker, see
`reference_models.config`), so the cost model prices them as the kernel runs (scores kept on chip), not as
the stand-in's fusions.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from reference_models.config import ATTENTION_KERNEL_SCOPE, HALF_VISITED_SCOPE, DecoderConfig
from reference_models.sharding import (
    ShardingContext,
    ambient_mesh,
    current_context,
    entry_axes,
    is_explicit,
    named_on,
)

FLASH_SCOPE = ATTENTION_KERNEL_SCOPE
OFF_DIAGONAL_SCOPE = HALF_VISITED_SCOPE


def attention_split(context: ShardingContext, logical: tuple[str, ...]) -> tuple[Any, Any, Any, int] | None:
    """The mesh axes `logical` places q [batch, seq, heads, dim] on: (batch, length, heads, how many devices
    split the sequence); None where the head dimension is split (an attention kernel's shard_map, MaxText's
    or its stand-in's, does not take that)."""
    batch, length, heads, dim = (tuple(context.resolve(logical)) + (None,) * 4)[:4]
    sizes = context.mesh.shape
    if any(sizes[axis] > 1 for axis in entry_axes(dim)):
        return None
    return batch, length, heads, math.prod(sizes[axis] for axis in entry_axes(length))


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, offset: int = 0) -> jax.Array:
    """Softmax attention with a causal mask; k/v may have fewer heads than q (grouped queries). The queries
    sit at positions `offset`, `offset + 1`, … of the keys' sequence."""
    batch, seq, heads, _ = q.shape
    probs = jax.nn.softmax(_row_scores(q, k, scale, offset), axis=-1).astype(v.dtype)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v)
    return out.reshape(batch, seq, heads, v.shape[-1])


def blockwise_causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: float, block: int, fused_backward: bool = False
) -> jax.Array:
    """The stand-in on one device's q [batch, seq, heads, dim], k and v (see the module): the same function
    as `causal_attention` (tested). Blocks that do not tile the sequence: one block of every row."""
    seq = q.shape[1]
    return _rows(q, k, v, None, scale, block if seq % block == 0 else seq, fused_backward)


def sequence_parallel_stand_in(
    config: DecoderConfig, q: jax.Array, k: jax.Array, v: jax.Array, scale: float, logical: tuple[str, ...]
) -> jax.Array | None:
    """The stand-in over q, k and v whose sequence `logical` splits over mesh axes (None where it does not,
    or where a head dimension is split too: the kernel's shard_map would not be MaxText's there)."""
    context = current_context()
    if context is None:
        return None
    split = attention_split(context, logical)
    if split is None or split[3] == 1 or q.shape[1] % split[3]:
        return None
    batch, length, heads, _ = split
    return context_parallel_stand_in(
        q,
        k,
        v,
        mesh=ambient_mesh(context),
        spec=(batch, length, heads),
        scale=scale,
        block=config.attention_block,
        fused_backward=config.attention_fused_backward,
    )


def context_parallel_stand_in(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mesh: jax.sharding.Mesh | None,
    spec: tuple[Any, ...],
    scale: float,
    block: int,
    fused_backward: bool,
) -> jax.Array:
    """The stand-in over queries split along the sequence (`spec`: the mesh axes of q's batch, length and
    heads), structured as the kernel's all-gather strategy (splash.context_parallel_splash): the keys and
    values enter split and are gathered inside the shard_map, so the backward pass gathers them again and
    reduce-scatters their gradients. `mesh` None: the ambient one (while tracing under `jax.set_mesh`)."""
    batch, length, heads = spec
    axes = entry_axes(length)
    queries = named_on(mesh, PartitionSpec(batch, length, heads, None))
    shards = math.prod(queries.mesh.shape[axis] for axis in axes)
    if is_explicit(queries.mesh):
        q, k, v = (jax.sharding.reshard(x, queries) for x in (q, k, v))

    def run(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        local = q.shape[1]
        shard = jax.lax.axis_index(axes)
        whole_k, whole_v = (jax.lax.all_gather(x, axes, axis=1, tiled=True) for x in (k, v))
        # The other shards' keys, the next shard's first: rolled so that this shard's own come last, and
        # dropped. Those before this shard are seen by all its queries; the others by none.
        shift = (shard + 1) * local
        other_k, other_v = (jnp.roll(x, -shift, axis=1)[:, : (shards - 1) * local] for x in (whole_k, whole_v))
        positions = (jnp.arange((shards - 1) * local) + shift) % (shards * local)
        before = positions < shard * local
        rows = block if local % block == 0 else local
        return _rows(q, k, v, (other_k, other_v, before), scale, rows, fused_backward)

    sharded = jax.shard_map(run, mesh=mesh, in_specs=(queries.spec,) * 3, out_specs=queries.spec, check_vma=False)
    return sharded(q, k, v)


def _rows(q: jax.Array, k: jax.Array, v: jax.Array, other: Any, scale: float, block: int, fused: bool) -> jax.Array:
    """q's rows, `block` at a time, against k and v (and the other shards' keys and values, if any)."""
    seq = q.shape[1]
    rows = [_row(q, k, v, other, scale, first, min(first + block, seq), fused) for first in range(0, seq, block)]
    return rows[0] if len(rows) == 1 else jnp.concatenate(rows, axis=1)


def _grouped(q: jax.Array, kv_heads: int) -> jax.Array:
    """q [batch, rows, heads, dim] as [batch, rows, kv heads, query heads per kv head, dim]."""
    batch, rows, heads, dim = q.shape
    return q.reshape(batch, rows, kv_heads, heads // kv_heads, dim)


def _causal_mask(rows: int, keys: int, first: int) -> jax.Array:
    """[rows, keys]: whether query row `first + i` may see key j."""
    return jnp.arange(rows)[:, None] + first >= jnp.arange(keys)[None, :]


def _row_scores(q: jax.Array, k: jax.Array, scale: float, first: int) -> jax.Array:
    """Masked float32 scores [batch, kv heads, groups, rows, keys] of query rows `first`… against k."""
    return _masked(_scores(q, k, scale), _causal_mask(q.shape[1], k.shape[1], first))


def _scores(q: jax.Array, k: jax.Array, scale: float) -> jax.Array:
    return jnp.einsum("bqhgd,bkhd->bhgqk", _grouped(q, k.shape[2]), k).astype(jnp.float32) * scale


def _masked(scores: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.where(mask, scores, jnp.finfo(jnp.float32).min)


def _segments(k: jax.Array, v: jax.Array, other: Any, rows: int, first: int, last: int) -> list[tuple]:
    """The keys rows `first`…`last` see, as (keys, values, [rows × keys] mask, scope) segments: the other
    shards' (if any; seen or not by whole shards) and the keys up to the diagonal."""
    segments: list[tuple] = []
    if other is not None:
        other_k, other_v, before = other
        segments.append((other_k, other_v, jnp.broadcast_to(before, (rows, other_k.shape[1])), OFF_DIAGONAL_SCOPE))
    segments.append((k[:, :last], v[:, :last], _causal_mask(rows, last, first), None))
    return segments


def _scope(name: str | None) -> contextlib.AbstractContextManager:
    return jax.named_scope(name) if name else contextlib.nullcontext()


def _row_forward(q, k, v, other, scale, first, last, fused_backward):
    # Sliced here, so the residuals are q, k and v themselves (no prefix copies), as the kernel's are.
    rows = q[:, first:last]
    segments = _segments(k, v, other, last - first, first, last)
    scores = []
    for seg_k, _, mask, scope in segments:
        with _scope(scope):
            scores.append(_masked(_scores(rows, seg_k, scale), mask))
    peak = jax.lax.stop_gradient(functools.reduce(jnp.maximum, [jnp.max(s, axis=-1, keepdims=True) for s in scores]))
    unnormalised = [jnp.exp(s - peak) for s in scores]
    total = functools.reduce(jnp.add, [jnp.sum(u, axis=-1, keepdims=True) for u in unnormalised])
    parts = []
    for u, (_, seg_v, _, scope) in zip(unnormalised, segments, strict=True):
        with _scope(scope):
            parts.append(jnp.einsum("bhgqk,bkhd->bqhgd", (u / total).astype(v.dtype), seg_v))
    out = functools.reduce(jnp.add, parts)
    # Named as the kernel names its residuals (MaxText's remat policies save or offload "context"); the
    # output returned is the named one, so that a policy saving it keeps what the next layer's backward
    # pass reads too, not only the residual.
    out = checkpoint_name(out.reshape(*out.shape[:2], -1, v.shape[-1]), "context")
    lse = checkpoint_name(peak + jnp.log(total), "context")
    return out, (q, k, v, other, out, lse)


def _row_backward(scale, first, last, fused_backward, residuals, d_out):
    # Traced where the gradient is taken: named as the kernel's ops explicitly.
    with jax.named_scope(FLASH_SCOPE):
        return _kernel_gradients(scale, first, last, fused_backward, residuals, d_out)


def _kernel_gradients(scale, first, last, fused_backward, residuals, d_out):
    """The kernel's backward: the query gradient (scores, the probabilities' gradient, dq) and the key/value
    gradient (scores, the probabilities' gradient, dv, dk) as separate passes, each recomputing what it
    needs, or one fused pass. The key/value pass works on the transposed scores [keys × query rows], as
    the kernel's key/value-gradient loop does; written so, the compiler cannot merge its matmuls with the
    query pass's (the two kernels share none of their work)."""
    q_all, k_all, v_all, other, out, lse = residuals
    q = q_all[:, first:last]
    batch, rows = q.shape[:2]
    kv_heads = k_all.shape[2]
    q_grouped, d_grouped = _grouped(q, kv_heads), _grouped(d_out, kv_heads)
    groups = q_grouped.shape[3]
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    delta = delta.reshape(batch, rows, kv_heads, groups).transpose(0, 2, 3, 1)[..., None]  # [b,h,g,q,1]
    # The query pass's scores are the queries scaled first (the kernel's forward pass scales them after), so
    # the compiler cannot take them from the rematerialised forward pass.
    scaled = (q_grouped.astype(jnp.float32) * scale).astype(q.dtype)
    dq = jnp.zeros(q.shape, jnp.float32)
    key_grads = []
    for k, v, mask, scope in _segments(k_all, v_all, other, rows, first, last):
        with _scope(scope):
            scores = jnp.einsum("bqhgd,bkhd->bhgqk", scaled, k).astype(jnp.float32)
            probs = jnp.exp(_masked(scores, mask) - lse)
            d_probs = jnp.einsum("bqhgd,bkhd->bhgqk", d_grouped, v).astype(jnp.float32)
            d_scores = probs * (d_probs - delta) * scale
            dq = dq + jnp.einsum("bhgqk,bkhd->bqhgd", d_scores.astype(q.dtype), k).reshape(q.shape)
            if fused_backward:
                dv = jnp.einsum("bhgqk,bqhgd->bkhd", probs.astype(v.dtype), d_grouped)
                dk = jnp.einsum("bhgqk,bqhgd->bkhd", d_scores.astype(k.dtype), q_grouped)
            else:
                # The key/value pass, over [keys × query rows].
                scores_t = jnp.einsum("bkhd,bqhgd->bhgkq", k, q_grouped).astype(jnp.float32) * scale
                probs_t = jnp.exp(_masked(scores_t, jnp.swapaxes(mask, 0, 1)) - jnp.swapaxes(lse, -1, -2))
                d_probs_t = jnp.einsum("bkhd,bqhgd->bhgkq", v, d_grouped).astype(jnp.float32)
                d_scores_t = probs_t * (d_probs_t - jnp.swapaxes(delta, -1, -2)) * scale
                dv = jnp.einsum("bhgkq,bqhgd->bkhd", probs_t.astype(v.dtype), d_grouped)
                dk = jnp.einsum("bhgkq,bqhgd->bkhd", d_scores_t.astype(k.dtype), q_grouped)
        key_grads.append((dk, dv))

    def padded(grad, like_all, start, stop):
        return jnp.zeros_like(like_all).at[:, start:stop].set(grad.astype(like_all.dtype))

    dk, dv = key_grads[-1]
    d_other = None
    if other is not None:
        # The other shards' keys and values get their gradients; which of them came before gets none.
        (other_dk, other_dv), (other_k, other_v, _) = key_grads[0], other
        d_other = (other_dk.astype(other_k.dtype), other_dv.astype(other_v.dtype), None)
    return (
        padded(dq, q_all, first, last),
        padded(dk, k_all, 0, last),
        padded(dv, v_all, 0, last),
        d_other,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _row(q, k, v, other, scale, first, last, fused_backward):
    return _row_forward(q, k, v, other, scale, first, last, fused_backward)[0]


_row.defvjp(_row_forward, _row_backward)
