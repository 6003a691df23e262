"""Pipeline parallelism over a `stage` mesh axis, as MaxText's pipeline runs it (`layers/pipeline.py`).

The pipelined stack's parameters are laid out as MaxText lays them out (`decoder.PipelineLayout`): every
leaf is [repeats, stages, …] with the stages dimension sharded over the stage axis, so stage s holds, for
each visit r, the parameters [r, s] of the layers it runs then. The batch is split into contiguous
microbatches, which enter MaxText's loop state (`pipeline_state.Schedule`: `state_io`, `shift` and, for a
circular schedule of more microbatches than stages, `circ_storage`), each buffer a global array with a
leading stage dimension split over the stage axis.

Every iteration is one global computation, as in MaxText: each stage's input is picked out of the loop
state, each stage's weights of its current visit out of all of its visits (a vmap of a dynamic slice over
the stage dimension), and the stages' layers run as a vmap over that dimension, which the partitioner
splits over the stage axis (with Auto axes through the vmap's `spmd_axis_name`; with Explicit axes the
stage dimension's sharding is part of the types and the vmap follows it). Only the loop state's moves
between stages are written per device: small shard_maps whose ppermutes become collective-permutes over
`stage`. Every other mesh axis keeps its meaning inside a stage, so FSDP and the MoE's own shard_map work
there as they do without a pipeline.

Schedule: `microbatches · repeats + stages - 1` iterations. With one visit per stage (GPipe) a stage runs
all its layers at each iteration; a circular schedule (MaxText's default: `repeats` visits of
`layers / (stages · repeats)` layers each) has the bubble shrink to `stages - 1` iterations of one visit.
Stage s's visit r runs parameters [r, s], so the layers run in the order MaxText numbers them: [r, s] (its
`layers_j`) is layer (r · stages + s) · per_visit + j (tested against the single-device step over the
layers in that order). Stages idle in the bubble compute on values whose results are never used.

Remat, as MaxText's pipeline does it: each iteration is rematerialised as a whole under the pipeline's
policy (`remat.pipeline_remat_policy`: the model's, plus each iteration's input, `iteration_input`, and each
layer's, `decoder_layer_input`, kept), so the backward pass recomputes each iteration once from what it kept.

Weights, as MaxText's settings place them inside the loop:
- With `fsdp_gather_once` (MaxText's `pipeline_fsdp_ag_once`) the whole stack is gathered over fsdp before
  the loop, and each iteration's weights are placed on their stored sharding without fsdp. With Explicit
  axes in a circular schedule they are also marked `reduced` over the batch axes (MaxText's data and fsdp),
  so each iteration's gradient of them is a partial sum until it leaves the layer's cast to the compute
  dtype, where it is summed over those axes; and it is added into the gradient of the weights as stored
  (split over fsdp) through a buffer of every visit, as MaxText's compile of seed 003 does it
  (`_gradient_to_stored`). With Auto axes the gradient is carried through the loop and summed once.
- Otherwise each iteration's weights are left to the partitioner (Auto: it gathers each visit's weights in
  the loop) or, with Explicit axes, placed on the stage axis alone: all the visits' weights gathered over
  every other axis, a computation on the loop's invariant weights which the scan hoists out of the loop.

JAX 0.10 has two gaps here, met as MaxText's pipeline meets them or worked round: a vmap refuses arrays
typed `reduced` (so the mark is put on inside the vmap, on each stage's weights); and with Explicit axes it
batches a shard_map inside the layers (the MoE's) with its stage dimension replicated, so each stage gathers
the other stages' tokens for it, as MaxText's pipeline code does under the same JAX.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from reference_models.pipeline_state import STAGES_IN, LoopBuffers, Schedule
from reference_models.sharding import ShardingContext, entry_axes, place, without_axes

# Applies one layer: (that layer's params, hidden [batch, seq, embed], its index within a visit) -> hidden.
LayerFn = Callable[[Any, jax.Array, int], jax.Array]
Policy = Callable[..., Any] | None  # a `jax.checkpoint` policy (None: no remat)

# The mesh axes MaxText marks a gathered-once stage weight `reduced` over (with Explicit axes).
_BATCH_AXES = ("data", "fsdp")


def run_pipeline(
    apply_layer: LayerFn,
    layers_of: Callable[[Any], list[Any]],
    params: Any,
    x: jax.Array,
    context: ShardingContext,
    path: tuple[str, ...],
    remat: Policy = None,
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
      path: the pipeline module's path, which its loop state (`state_io`, `shift`) is recorded under.
      remat: the policy each iteration is rematerialised under (None: no remat, everything kept).
      stored_specs: each parameter's sharding as the rules place it (as `params`), needed when the settings
        gather the weights over fsdp once (`fsdp_gather_once`).

    Returns:
      The stack's output, as `x`.
    """
    settings = context.pipeline
    assert settings is not None
    axis = settings.stage_axis
    stages = context.mesh.shape[axis]
    count, repeats = settings.microbatches, settings.repeats
    stage_dim = 1 if repeats > 1 else 0
    leaf = jax.tree.leaves(params)[0]
    if leaf.shape[stage_dim] != stages or (repeats > 1 and leaf.shape[0] != repeats):
        raise ValueError(f"parameters of shape {leaf.shape} are not laid out for {stages} stages × {repeats} repeats")
    if count % stages:
        raise ValueError(f"{count} microbatches do not split over {stages} pipeline stages")
    if x.shape[0] % count:
        raise ValueError(f"a batch of {x.shape[0]} does not split into {count} microbatches")
    plan = Schedule(axis, stages, count, repeats)
    loop = plan.start(context, path, x)

    # Each stage's spec of a visit's weights (MaxText's physical spec with the repeats dimension removed),
    # known only when the weights are gathered once.
    visit_specs = None
    # The weights the iterations read, and those their gradient goes to (None: the same).
    read, stored = params, None
    if settings.fsdp_gather_once:
        if stored_specs is None:
            raise ValueError("fsdp_gather_once needs the parameters' stored shardings (stored_specs)")
        # MaxText's pipeline_fsdp_ag_once: the whole stack gathered over fsdp before the loop, so no
        # iteration gathers a layer's weights again.
        read = jax.tree.map(
            lambda p, spec: place(context, p, without_axes(spec, settings.gathered_once)), params, stored_specs
        )
        if context.explicit and repeats > 1:
            # MaxText's explicit circular pipeline adds each iteration's visit gradient into the gradient of
            # the weights as they are stored (split over fsdp), not of the gathered copy: its compile makes
            # every iteration's scatter of the visit's gradient into all the visits, then slices this
            # device's share of that to add it. The gathered copy is read; the gradient goes to the stored.
            read, stored = jax.lax.stop_gradient(read), params
        visit_specs = jax.tree.map(lambda spec: PartitionSpec(*tuple(spec)[stage_dim:]), stored_specs, is_leaf=_is_spec)
    weights = _VisitWeights(context, plan, settings.gathered_once, visit_specs)

    def stage_layers(stage_params: Any, hidden: jax.Array) -> jax.Array:
        """One stage's layers of one visit, in turn."""
        for index, layer_params in enumerate(layers_of(weights.marked_reduced(stage_params))):
            hidden = apply_layer(layer_params, hidden, index)
        return hidden

    # With Explicit axes the stage dimension's sharding is in the types, which the vmap follows. (There, as
    # JAX 0.10 batches a shard_map inside the layers, the MoE's, its stage dimension is replicated: each stage
    # gathers the other stages' tokens for it, as MaxText's pipeline does under the same JAX.)
    all_stages = jax.vmap(stage_layers, spmd_axis_name=None if context.explicit else axis)

    def iteration(loop: LoopBuffers, read: Any, stored: Any, step: jax.Array) -> LoopBuffers:
        params = read
        if stored is not None:
            params = jax.tree.map(lambda s, r: _gradient_to_stored(jax.typeof(s).sharding.spec, s, r), stored, read)
        inputs = checkpoint_name(plan.stage_inputs(context, loop, step), "iteration_input")
        return plan.advance(context, loop, all_stages(weights.of_iteration(params, step), inputs), step)

    if remat is not None:
        iteration = jax.checkpoint(iteration, prevent_cse=False, policy=remat)

    def one_step(carry: LoopBuffers, step: jax.Array) -> tuple[LoopBuffers, None]:
        return iteration(carry, read, stored, step), None

    loop, _ = jax.lax.scan(one_step, loop, jnp.arange(plan.iterations))
    return plan.finish(context, loop.state_io)


class _VisitWeights:
    """Each iteration's weights of every stage, [stages, …], as MaxText's pipeline picks and places them
    (`get_current_stage_weights`, `vmap_parallel_gather`, `shard_dim_by_stages`)."""

    def __init__(
        self, context: ShardingContext, plan: Schedule, gathered: tuple[str, ...], visit_specs: Any | None
    ) -> None:
        self.context, self.plan, self.gathered, self.visit_specs = context, plan, gathered, visit_specs

    def of_iteration(self, params: Any, step: jax.Array) -> Any:
        """The weights each stage runs at iteration `step`: with one visit, all of them; else each stage's
        visit of the moment, sliced out of all of its visits."""
        if self.plan.repeats == 1:
            return params
        repeat_ids = self._on_stages(self.plan.repeat_ids(step), 0, None)
        if self.visit_specs is None:
            return jax.tree.map(lambda w: self._gather(w, repeat_ids, None), params)
        return jax.tree.map(lambda w, spec: self._gather(w, repeat_ids, spec), params, self.visit_specs)

    def _gather(self, weights: jax.Array, repeat_ids: jax.Array, spec: PartitionSpec | None) -> jax.Array:
        weights = self._on_stages(weights, 1, spec)

        def pick(stage_weights: jax.Array, repeat: jax.Array) -> jax.Array:
            return jnp.squeeze(jax.lax.dynamic_slice_in_dim(stage_weights, repeat, 1, 0), 0)

        picked = jax.vmap(pick, in_axes=(1, 0))(weights, repeat_ids)
        return self._on_stages(picked, 0, spec, stage_weight=True)

    def _on_stages(self, x: jax.Array, dim: int, spec: PartitionSpec | None, stage_weight: bool = False) -> jax.Array:
        """`x` with dimension `dim` on the stage axis and the rest as `spec` (a visit's stored spec, [stages,
        …]) says without the gathered axes; without a spec, left to the partitioner (Auto) or replicated
        (Explicit). MaxText's `shard_dim_by_stages`."""
        placeholder = None if self.context.explicit else PartitionSpec.UNCONSTRAINED
        if spec is None:
            entries: list[Any] = [placeholder] * x.ndim
        else:
            entries = list(without_axes(spec, self.gathered))
            entries += [None] * (x.ndim - (0 if stage_weight else 1) - len(entries))
            if not stage_weight:
                entries = [placeholder] * (dim + 1) + entries[dim:]
        entries[dim] = self.plan.axis
        return place(self.context, x, PartitionSpec(*entries))

    def marked_reduced(self, stage_params: Any) -> Any:
        """One stage's weights of a visit (inside the vmap over stages) as MaxText types the gathered-once
        weights of a circular schedule with Explicit axes: `reduced` over the batch axes, so that their
        gradient stays a partial sum until it leaves the layer's cast to the compute dtype. (MaxText marks
        the [stages, …] weights before its vmap; the vmap over them only takes the mark inside.)"""
        if not (self.context.explicit and self.visit_specs is not None and self.plan.repeats > 1):
            return stage_params
        mesh = self.context.mesh
        # MaxText marks data and fsdp; the gradient's matmuls need every axis they contract over (the
        # activations' batch and length axes) marked, which are those two under MaxText's rules.
        inside = self.context.resolve(STAGES_IN)
        contracted = {name for entry in tuple(inside)[1:3] for name in entry_axes(entry)}
        batch_axes = {name for name in (*_BATCH_AXES, *contracted) if mesh.shape.get(name, 1) > 1}

        def mark(w: jax.Array, spec: PartitionSpec) -> jax.Array:
            entries = list(without_axes(spec, self.gathered))[1:]
            entries += [None] * (w.ndim - len(entries))
            if not batch_axes or batch_axes & {name for entry in entries for name in entry_axes(entry)}:
                return w  # (a weight split over one of them cannot be reduced over them all)
            return jax.sharding.reshard(w, PartitionSpec(*entries, reduced=batch_axes))

        return jax.tree.map(mark, stage_params, self.visit_specs)


def _is_spec(value: Any) -> bool:
    return isinstance(value, PartitionSpec)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gradient_to_stored(spec: PartitionSpec, stored: jax.Array, gathered: jax.Array) -> jax.Array:
    """`gathered` (the stored weights gathered over fsdp), whose gradient goes to `stored` (of sharding
    `spec`): resliced to it where it arises."""
    del stored
    return gathered


def _gradient_to_stored_forward(spec, stored, gathered):
    return gathered, None


def _gradient_to_stored_backward(spec, _, grad):
    return jax.sharding.reshard(grad, spec), None


_gradient_to_stored.defvjp(_gradient_to_stored_forward, _gradient_to_stored_backward)
