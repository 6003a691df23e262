"""Pipeline parallelism over a `stage` mesh axis (GPipe schedule): a shard_map over that axis and ppermute.

The main layer stack's parameters are sharded over the stage axis on their layers dimension (index 1, as
MaxText stacks them), so stage s holds a contiguous block of layers. The batch is split into microbatches. The whole
schedule runs inside a shard_map that makes only the stage axis manual: every other mesh axis keeps its
meaning (Explicit axes stay part of the array types), so FSDP and the MoE's own shard_map over the
remaining axes work inside a stage as they do without a pipeline.

Schedule: at each of `microbatches + stages - 1` iterations every stage runs its layers on what it holds,
then a ppermute (a collective-permute over `stage`) rotates each stage's output to the next stage. Stage
0 takes a fresh microbatch instead of what it receives; the last stage's outputs from iteration
`stages - 1` on are the pipeline's result. Stages idle in the bubble compute on values whose results are
never used, so the math equals running the layers in sequence. The backward pass recomputes the
schedule (the stage loop is rematerialised) and runs it transposed, so the compiled step has the
rotation in three loops of `microbatches + stages - 1` trips: forward, recomputed forward, backward.

What JAX 0.10 imposes:
- Varying-axis checks (`check_vma`) are off for this shard_map: with them on, the residuals the nested
  MoE shard_map saves for its backward pass are given a sharding over the already-manual stage axis too,
  which the partitioner rejects ("manual axes must come before free axes"). Without them every
  collective transposes as written, so the result leaves per stage ([stages, ...] over `stage`) and is
  summed outside (only the last stage's is non-zero): one all-reduce over `stage`.
- Rematerialising the stage loop keeps residuals from crossing the shard_map boundary at all.
- With Explicit mesh axes, a shard_map manual over only some axes is lowered with the other axes'
  dimensions closed and replicated, so what enters it (the stage's parameters, the microbatches) is
  all-gathered over fsdp/expert once per step at the boundary and sliced again inside. With Auto axes
  those dimensions stay open and nothing is gathered there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from reference_models.sharding import ShardingContext, ambient_mesh, entry_axes, place

# Applies one layer: (that layer's params, hidden [batch, seq, embed]) -> hidden.
LayerFn = Callable[[Any, jax.Array], jax.Array]


def run_pipeline(
    apply_layer: LayerFn,
    stacked_params: Any,
    x: jax.Array,
    context: ShardingContext,
    layer_axis: int,
    batch_spec: PartitionSpec,
) -> jax.Array:
    """Runs `apply_layer` for every layer of `stacked_params` over `x`, pipelined across stages.

    Args:
      apply_layer: one layer's forward.
      stacked_params: the stack's parameters, every leaf with a layers dimension (at `layer_axis`) sharded
        over the stage axis.
      x: the stack's input [batch, seq, embed].
      context: the active sharding context (its `pipeline` settings are used).
      layer_axis: where the layers dimension sits in every parameter.
      batch_spec: the sharding of [batch, seq, embed] inside a stage (the residual stream's); it must not
        use the stage axis.

    Returns:
      The stack's output, as `x`.
    """
    settings = context.pipeline
    assert settings is not None
    axis = settings.stage_axis
    stages = context.mesh.shape[axis]
    count = settings.microbatches
    layers = jax.tree.leaves(stacked_params)[0].shape[layer_axis]
    if layers % stages:
        raise ValueError(f"{layers} layers do not split into {stages} pipeline stages")
    if x.shape[0] % count:
        raise ValueError(f"a batch of {x.shape[0]} does not split into {count} microbatches")
    if any(axis in entry_axes(entry) for entry in batch_spec):
        raise ValueError(f"the activations inside a pipeline stage must not be sharded over {axis!r}: {batch_spec}")
    micro = _to_microbatches(context, x, count, batch_spec)
    # The microbatches enter every stage whole, so their gradient is summed over the stage axis; JAX writes
    # that sum's reducer with a sharding constraint in it, which XLA's CPU compiler cannot widen from 16-bit
    # floats (it aborts the process: "Invalid binary instruction opcode copy" in AllReducePromotion). On CPU
    # the microbatches cross the stage boundary in float32; the values are the same (the CPU route prices
    # that sum in the 16-bit type it holds), and the TPU program is untouched.
    inner_dtype = micro.dtype
    if _on_cpu(context) and jnp.dtype(inner_dtype).itemsize < 4 and jnp.issubdtype(inner_dtype, jnp.floating):
        micro = micro.astype(jnp.float32)

    def stage_layers(params, hidden):
        def one_layer(h, layer_params):
            return apply_layer(layer_params, h), None

        return jax.lax.scan(one_layer, hidden, jax.tree.map(lambda p: jnp.moveaxis(p, layer_axis, 0), params))[0]

    def schedule(params, micro):
        micro = micro.astype(inner_dtype)
        stage = jax.lax.axis_index(axis)
        first, last = stage == 0, stage == stages - 1
        rotation = [(s, (s + 1) % stages) for s in range(stages)]

        def iteration(carry, step):
            state, outputs = carry
            hidden = jnp.where(first, micro[jnp.minimum(step, count - 1)], state)
            out = stage_layers(params, hidden)
            finished = step - (stages - 1)
            slot = jnp.clip(finished, 0, count - 1)
            outputs = outputs.at[slot].set(jnp.where(last & (finished >= 0), out, outputs[slot]))
            # Stage s hands its output to stage s + 1 (what reaches stage 0 is replaced by a fresh microbatch).
            return (jax.lax.ppermute(out, axis, rotation), outputs), None

        state = jnp.zeros_like(micro[0])
        (_, outputs), _ = jax.lax.scan(iteration, (state, jnp.zeros_like(micro)), jnp.arange(count + stages - 1))
        return outputs[None]

    # Varying-axis checks stay off here: with them on, the residuals a nested shard_map (the MoE's) saves
    # for the backward pass get sharded over the already-manual stage axis as well, which the partitioner
    # rejects. Without them every collective transposes as written, so the result leaves per stage
    # ([stages, ...] over the stage axis) rather than as one replicated value.
    run = jax.shard_map(
        jax.checkpoint(schedule),
        mesh=ambient_mesh(context),
        in_specs=(jax.tree.map(lambda _: PartitionSpec(*(None,) * layer_axis, axis), stacked_params), PartitionSpec()),
        out_specs=PartitionSpec(axis),
        axis_names={axis},
        check_vma=False,
    )
    # Only the last stage's outputs are non-zero: the sum over stages is an all-reduce over `stage`.
    outputs = jnp.sum(run(stacked_params, micro), axis=0)
    return _from_microbatches(context, outputs, batch_spec)


def _on_cpu(context: ShardingContext) -> bool:
    return context.mesh.devices.flat[0].platform == "cpu"


def _to_microbatches(context: ShardingContext, x: jax.Array, count: int, batch_spec: PartitionSpec) -> jax.Array:
    """[batch, ...] → [count, batch / count, ...]; microbatch m holds rows m, m + count, m + 2·count, ….

    Strided rows keep every device's rows on that device (a local reshape, no communication).
    """
    entries = tuple(batch_spec) + (None,) * (x.ndim - len(batch_spec))
    spec = PartitionSpec(entries[0], None, *entries[1:])
    strided = _reshape(context, x, (x.shape[0] // count, count, *x.shape[1:]), spec)
    return jnp.moveaxis(strided, 1, 0)


def _from_microbatches(context: ShardingContext, micro: jax.Array, batch_spec: PartitionSpec) -> jax.Array:
    count, size = micro.shape[:2]
    return _reshape(context, jnp.moveaxis(micro, 0, 1), (count * size, *micro.shape[2:]), batch_spec)


def _reshape(context: ShardingContext, x: jax.Array, shape: tuple[int, ...], spec: PartitionSpec) -> jax.Array:
    """Reshape onto `spec`; explicit axes need the result's sharding given to the reshape itself."""
    if context.explicit:
        return jax.lax.reshape(x, shape, out_sharding=spec)
    return place(context, x.reshape(shape), spec)
