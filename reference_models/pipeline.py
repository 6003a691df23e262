"""Pipeline parallelism over a `stage` mesh axis: a shard_map over that axis and ppermute.

The pipelined stack's parameters are laid out as MaxText lays them out (`decoder.PipelineLayout`): every
leaf is [repeats, stages, …] with the stages dimension sharded over the stage axis, so stage s holds, for
each visit r, the parameters [r, s] of the layers it runs then. The batch is split into microbatches. The
whole schedule runs inside a shard_map that makes only the stage axis manual: every other mesh axis keeps
its meaning (Explicit axes stay part of the array types), so FSDP and the MoE's own shard_map over the
remaining axes work inside a stage as they do without a pipeline.

Schedule: at each step every stage runs its layers of the current visit on what it holds, then a ppermute
(a collective-permute over `stage`) rotates each stage's output to the next stage. Stage 0 takes a fresh
microbatch instead of what it receives. With one visit per stage (GPipe) a stage runs all its layers at
each of `microbatches + stages - 1` steps. A circular schedule (MaxText's default: `repeats` visits of
`layers / (stages · repeats)` layers each, one layer per visit unless MaxText's
`num_layers_per_pipeline_stage` says otherwise) takes `microbatches · repeats + stages - 1` steps: what
stage 0 receives from the last stage waits in a buffer until that microbatch's next visit, and the bubble
shrinks to `stages - 1` steps of one visit. Stage s's visit r runs parameters [r, s], so the layers run in
the order MaxText numbers them: [r, s] (its `layers_j`) is layer (r · stages + s) · per_visit + j (tested
against the single-device step over the layers in that order). Stages idle in the bubble compute on values
whose results are never used.

Remat, as MaxText's pipeline does it: each layer is rematerialised under the model's policy and the
schedule around the layers keeps each layer's input (`decoder_layer_input`, offloaded to host memory when
a custom policy says so), so the backward pass recomputes each layer once from its kept input and runs the
schedule transposed.

What JAX 0.10 imposes:
- Varying-axis checks (`check_vma`) are off for this shard_map: with them on, the residuals the nested
  MoE shard_map saves for its backward pass are given a sharding over the already-manual stage axis too,
  which the partitioner rejects ("manual axes must come before free axes"). Without them every
  collective transposes as written, so the result leaves per stage ([stages, ...] over `stage`) and is
  summed outside (only the last stage's is non-zero): one all-reduce over `stage`.
- The schedule is rematerialised as a whole, so the residuals that cross the shard_map boundary are only
  the layer inputs it keeps.
- With Explicit mesh axes, a shard_map manual over only some axes is lowered with the other axes'
  dimensions closed and replicated, so what enters it (the stage's parameters, the microbatches) is
  all-gathered over fsdp/expert once per step at the boundary and sliced again inside. With Auto axes
  those dimensions stay open and nothing is gathered there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from reference_models.sharding import ShardingContext, ambient_mesh, entry_axes, place

# Applies one layer: (that layer's params, hidden [batch, seq, embed], its index within a visit) -> hidden.
LayerFn = Callable[[Any, jax.Array, int], jax.Array]
Policy = Callable[..., Any] | None  # a `jax.checkpoint` policy (None: save nothing)


@dataclass(frozen=True)
class PipelineRemat:
    """How a pipeline rematerialises: each layer under `layer` (the model's remat policy), the schedule
    around them under `schedule` (which keeps each layer's input, `decoder_layer_input`)."""

    layer: Policy
    schedule: Policy


def run_pipeline(
    apply_layer: LayerFn,
    layers_of: Callable[[Any], list[Any]],
    params: Any,
    x: jax.Array,
    context: ShardingContext,
    batch_spec: PartitionSpec,
    remat: PipelineRemat | None = None,
    stored_specs: Any = None,
) -> jax.Array:
    """Runs every layer of a pipelined stack over `x`, across stages.

    Args:
      apply_layer: one layer's forward.
      layers_of: one stage's parameters for one visit → its layers' parameters, in the order they run.
      params: the stack's parameters in MaxText's layout: every leaf [repeats, stages, …] ([stages, …] with
        one repeat), the stages dimension sharded over the stage axis.
      x: the stack's input [batch, seq, embed].
      context: the active sharding context (its `pipeline` settings are used).
      batch_spec: the sharding of [batch, seq, embed] inside a stage (the residual stream's); it must not
        use the stage axis.
      remat: how the backward pass recomputes (None: the layers keep everything, the schedule nothing).
      stored_specs: each parameter's sharding as the rules place it (as `params`), needed when the settings
        gather the weights over fsdp once (`fsdp_gather_once`).

    Returns:
      The stack's output, as `x`.
    """
    settings = context.pipeline
    assert settings is not None
    axis = settings.stage_axis
    stages = context.mesh.shape[axis]
    count = settings.microbatches
    repeats = settings.repeats
    stage_dim = 1 if repeats > 1 else 0
    leaf = jax.tree.leaves(params)[0]
    if leaf.shape[stage_dim] != stages or (repeats > 1 and leaf.shape[0] != repeats):
        raise ValueError(f"parameters of shape {leaf.shape} are not laid out for {stages} stages × {repeats} repeats")
    if repeats > 1 and count < stages:
        raise ValueError(f"a circular pipeline needs at least as many microbatches ({count}) as stages ({stages})")
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
    if context.platform == "cpu" and jnp.dtype(inner_dtype).itemsize < 4 and jnp.issubdtype(inner_dtype, jnp.floating):
        micro = micro.astype(jnp.float32)

    def chosen_layer(blocks, visit, index, hidden):
        # A circular schedule's step runs visit `visit` of the stage's blocks (see `_circular`); its layer
        # `index` is picked here so that a rematerialised layer picks it again in the backward pass instead
        # of keeping the pick of every step.
        if visit is None:
            picked = blocks
        elif gathered is None:
            picked = jax.tree.map(lambda b: b[visit], blocks)
        else:
            picked = jax.tree.map(lambda b, g: _pick_visit(b, visit) if g else b[visit], blocks, gathered)
        return apply_layer(layers_of(picked)[index], hidden, index)

    run_layer = chosen_layer
    if remat is not None:
        checkpointed = jax.checkpoint(chosen_layer, prevent_cse=False, policy=remat.layer, static_argnums=(2,))

        def run_layer(blocks, visit, index, hidden):
            return checkpointed(blocks, visit, index, checkpoint_name(hidden, "decoder_layer_input"))

    def stage_layers(blocks, visit, hidden):
        """One visit's layers in turn: `blocks` holds the stage's parameters (a circular schedule's: every
        visit's, ahead of the rest, of which `visit` is the index)."""
        for index in range(per_visit):
            hidden = run_layer(blocks, visit, index, hidden)
        return hidden

    per_visit = len(layers_of(jax.tree.map(lambda _: None, params)))  # (read from the tree's structure)

    def schedule(params, micro):
        # This stage's parameters: [repeats, …] blocks (block r: what it runs on visit r), or one block.
        params = jax.tree.map(lambda p: jnp.squeeze(p, stage_dim), params)
        micro = micro.astype(inner_dtype)
        stage = jax.lax.axis_index(axis)
        first, last = stage == 0, stage == stages - 1
        rotation = [(s, (s + 1) % stages) for s in range(stages)]

        def iteration(carry, step, blocks, visit=None):
            """One step of the schedule: every stage runs its layers of this visit (see `stage_layers`)."""
            state, outputs, *waiting = carry
            if repeats > 1:
                # What stage 0 receives is the last stage's output of the step before; it waits here until
                # its microbatch comes round for its next visit (at least `stages` steps later). Scalar
                # selects: a predicate broadcast to a buffer's shape would be kept for every step.
                came, index = step - stages, (step - stage) % count
                kept = waiting[0][came % count]
                waiting = [waiting[0].at[came % count].set(jax.lax.select(first & (came >= 0), state, kept))]
                entering = jax.lax.select(step - stage < count, micro[index], waiting[0][index])
            else:
                entering = micro[jnp.minimum(step, count - 1)]
            hidden = jnp.where(first, entering, state)
            out = stage_layers(blocks, visit, hidden)
            # The last stage's output of a microbatch's last visit is the pipeline's result for it.
            finished = step - (stages - 1) - count * (repeats - 1)
            slot = jnp.clip(finished, 0, count - 1)
            outputs = outputs.at[slot].set(jnp.where(last & (finished >= 0), out, outputs[slot]))
            # Stage s hands its output to stage s + 1 (the last stage's goes round to stage 0).
            return (jax.lax.ppermute(out, axis, rotation), outputs, *waiting)

        # A circular schedule keeps the microbatches between visits (stage 0's); one visit needs no store.
        waiting = [jnp.zeros_like(micro)] if repeats > 1 else []
        carry = (jnp.zeros_like(micro[0]), jnp.zeros_like(micro), *waiting)
        if repeats == 1:
            steps = jnp.arange(count + stages - 1)
            carry, _ = jax.lax.scan(lambda c, step: (iteration(c, step, params), None), carry, steps)
        else:
            carry = _circular(iteration, carry, params, stage)
        return carry[1][None]

    def _circular(iteration, carry, blocks, stage):
        """The circular schedule's `count · repeats + stages - 1` steps, as MaxText's pipeline runs them
        (`get_current_repeat_from_stages`, with Auto and with Explicit mesh axes): each step picks its
        visit's block out of all of the stage's layers at a traced index, so the gradient of the stage's
        layers gathers in one buffer of all of them (with Explicit axes, see `_pick_visit` for what more
        that costs)."""

        def one_step(c, step):
            return iteration(c, step, blocks, jnp.clip((step - stage) // count, 0, repeats - 1)), None

        carry, _ = jax.lax.scan(one_step, carry, jnp.arange(count * repeats + stages - 1))
        return carry

    # Which parameters are stored split over other axes than the stage axis: with Explicit axes they are
    # gathered at the boundary (and with `fsdp_gather_once` before it), and their gradient is the buffer of
    # every visit `_pick_visit` makes, as in MaxText's explicit pipeline, gathered once or not.
    gathered = jax.tree.map(lambda p: _split_beyond(p, axis), params) if context.explicit else None
    if settings.fsdp_gather_once:
        if stored_specs is None:
            raise ValueError("fsdp_gather_once needs the parameters' stored shardings (stored_specs)")
        # MaxText's pipeline_fsdp_ag_once: the whole stack gathered over fsdp before the schedule's loop, so
        # no step gathers a layer's weights again; its gradient is reduce-scattered back once.
        params = jax.tree.map(
            lambda p, spec: place(context, p, _without_axes(spec, settings.gathered_once)), params, stored_specs
        )

    # Varying-axis checks stay off here: with them on, the residuals a nested shard_map (the MoE's) saves
    # for the backward pass get sharded over the already-manual stage axis as well, which the partitioner
    # rejects. Without them every collective transposes as written, so the result leaves per stage
    # ([stages, ...] over the stage axis) rather than as one replicated value.
    run = jax.shard_map(
        jax.checkpoint(schedule, policy=None if remat is None else remat.schedule),
        mesh=ambient_mesh(context),
        in_specs=(jax.tree.map(lambda _: PartitionSpec(*(None,) * stage_dim, axis), params), PartitionSpec()),
        out_specs=PartitionSpec(axis),
        axis_names={axis},
        check_vma=False,
    )
    # Only the last stage's outputs are non-zero: the sum over stages is an all-reduce over `stage`.
    outputs = jnp.sum(run(params, micro), axis=0)
    return _from_microbatches(context, outputs, batch_spec)


def _without_axes(spec: PartitionSpec, axes: tuple[str, ...]) -> PartitionSpec:
    """`spec` with `axes` taken out of every entry (an entry left with none is replicated)."""
    entries = []
    for entry in spec:
        kept = tuple(name for name in entry_axes(entry) if name not in axes)
        entries.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*entries)


def _split_beyond(array: jax.Array, stage_axis: str) -> bool:
    """Whether an array's type splits it over a mesh axis (of more than one device) besides the stage axis."""
    sharding = jax.typeof(array).sharding
    mesh = sharding.mesh
    return any(name != stage_axis and mesh.shape[name] > 1 for entry in sharding.spec for name in entry_axes(entry))


@jax.custom_vjp
def _pick_visit(blocks: jax.Array, visit: jax.Array) -> jax.Array:
    """`blocks[visit]` of weights gathered at the stage boundary, whose gradient is a buffer of all the blocks
    at every step, as in MaxText's explicit pipeline: it gathers each step's weights with an explicit output
    sharding, and when the stage's weights are split over other axes too (FSDP) the compiler materialises
    that gather's transpose (the step's gradient scattered into zeros the size of all of a stage's layers)
    and adds it, resliced, into the split gradient at every step; weights split over the stage axis alone
    take the step's gradient in place (`block[visit]`). The barrier keeps the compiler from folding the
    scatter into the sum here, as it cannot in MaxText's program."""
    return blocks[visit]


def _pick_visit_forward(blocks: jax.Array, visit: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    # An empty array of the blocks' count and dtype: what the backward pass needs of them, in its static type.
    return blocks[visit], (visit, jnp.zeros((blocks.shape[0], 0), blocks.dtype))


def _pick_visit_backward(residuals: tuple[jax.Array, jax.Array], grad: jax.Array) -> tuple[jax.Array, None]:
    visit, template = residuals
    spec = jax.typeof(grad).sharding.spec
    zeros = jnp.zeros((template.shape[0], *grad.shape), template.dtype, out_sharding=PartitionSpec(None, *spec))
    scattered = zeros.at[visit].set(grad.astype(template.dtype))
    return jax.lax.optimization_barrier(scattered), None


_pick_visit.defvjp(_pick_visit_forward, _pick_visit_backward)


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
