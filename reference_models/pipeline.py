"""Pipeline parallelism over a `stage` mesh axis, with MaxText's loop state (`layers/pipeline.py`).

The pipelined stack's parameters are laid out as MaxText lays them out (`decoder.PipelineLayout`): every
leaf is [repeats, stages, …] with the stages dimension sharded over the stage axis, so stage s holds, for
each visit r, the parameters [r, s] of the layers it runs then. The batch is split into contiguous
microbatches, which enter MaxText's loop state (`_Schedule`, `LoopBuffers`: `state_io`, `shift` and, for a
circular schedule of more microbatches than stages, `circ_storage`), each buffer with a leading stage
dimension split over the stage axis and recorded with MaxText's logical axes. The iterations run inside a
shard_map that makes only the stage axis manual: every other mesh axis keeps its meaning (Explicit axes stay
part of the array types), so FSDP and the MoE's own shard_map over the remaining axes work inside a stage as
they do without a pipeline. (MaxText runs its stages as a vmap over that dimension instead, which the
partitioner splits over the stage axis the same way; the loop state and its rotations are the same.)

Schedule: `microbatches · repeats + stages - 1` iterations; at each, every stage runs its layers of the
current visit on its input, then each buffer moves one stage along (a ppermute, a collective-permute over
`stage`). With one visit per stage (GPipe) a stage runs all its layers at each iteration; a circular schedule
(MaxText's default: `repeats` visits of `layers / (stages · repeats)` layers each, one layer per visit unless
MaxText's `num_layers_per_pipeline_stage` says otherwise) has the bubble shrink to `stages - 1` iterations of
one visit. Stage s's visit r runs parameters [r, s], so the layers run in the order MaxText numbers them:
[r, s] (its `layers_j`) is layer (r · stages + s) · per_visit + j (tested against the single-device step
over the layers in that order). Stages idle in the bubble compute on values whose results are never used.

Remat, as MaxText's pipeline does it: each layer is rematerialised under the model's policy and the
schedule around the layers keeps each layer's input (`decoder_layer_input`, offloaded to host memory when
a custom policy says so), so the backward pass recomputes each layer once from its kept input and runs the
schedule transposed.

What JAX 0.10 imposes:
- Varying-axis checks (`check_vma`) are off for this shard_map: with them on, the residuals the nested
  MoE shard_map saves for its backward pass are given a sharding over the already-manual stage axis too,
  which the partitioner rejects ("manual axes must come before free axes").
- The schedule is rematerialised as a whole, so the residuals that cross the shard_map boundary are only
  the layer inputs it keeps.
- With Explicit mesh axes, a shard_map manual over only some axes is lowered with the other axes'
  dimensions closed and replicated, so what enters it (the stage's parameters, the loop state) is
  all-gathered over fsdp/expert once per step at the boundary and sliced again inside. With Auto axes
  those dimensions stay open and nothing is gathered there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from reference_models.sharding import ShardingContext, ambient_mesh, constrain, entry_axes, place, without_axes

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
    path: tuple[str, ...],
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
      path: the pipeline module's path, which its loop state (`state_io`, `shift`) is recorded under.
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
    if count % stages:
        raise ValueError(f"{count} microbatches do not split over {stages} pipeline stages")
    if x.shape[0] % count:
        raise ValueError(f"a batch of {x.shape[0]} does not split into {count} microbatches")
    plan = _Schedule(axis, stages, count, repeats)
    loop = plan.start(context, path, x)

    def chosen_layer(blocks, visit, index, hidden):
        # A circular schedule's step runs visit `visit` of the stage's blocks (`one_step` computes it); its layer
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

    def schedule(params, loop):
        # This stage's parameters: [repeats, …] blocks (block r: what it runs on visit r), or one block; and
        # its slice of every loop-state buffer (their stage dimension dropped).
        params = jax.tree.map(lambda p: jnp.squeeze(p, stage_dim), params)
        loop = jax.tree.map(lambda b: jnp.squeeze(b, 0), loop)
        stage = jax.lax.axis_index(axis)

        def one_step(carry, step):
            visit = plan.visit(step, stage)
            return plan.advance(carry, step, stage, lambda hidden: stage_layers(params, visit, hidden)), None

        loop, _ = jax.lax.scan(one_step, loop, jnp.arange(plan.iterations))
        return loop.state_io[None]

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
            lambda p, spec: place(context, p, without_axes(spec, settings.gathered_once)), params, stored_specs
        )

    # Varying-axis checks stay off here: with them on, the residuals a nested shard_map (the MoE's) saves
    # for the backward pass get sharded over the already-manual stage axis as well, which the partitioner
    # rejects.
    run = jax.shard_map(
        jax.checkpoint(schedule, policy=None if remat is None else remat.schedule),
        mesh=ambient_mesh(context),
        in_specs=(jax.tree.map(lambda _: PartitionSpec(*(None,) * stage_dim, axis), params), PartitionSpec(axis)),
        out_specs=PartitionSpec(axis),
        axis_names={axis},
        check_vma=False,
    )
    return plan.finish(context, run(params, loop))


class LoopBuffers(NamedTuple):
    """MaxText's pipeline loop state (its `init_states`), each buffer with a leading stage dimension split
    over the stage axis: what every stage holds between two iterations."""

    state_io: jax.Array  # [stages, microbatches / stages, micro, seq, embed]: inputs in, outputs out
    shift: jax.Array  # [stages, micro, seq, embed]: each stage's output, on its way to the next stage
    circ_storage: jax.Array | None  # [stages, microbatches, micro, seq, embed]: outputs waiting for their next visit
    circ_mover: jax.Array | None  # [stages, micro, seq, embed]: the last output, stored one iteration later


# MaxText's logical axes of the loop state: `shift` (and each iteration's stage inputs), `state_io`, and the
# microbatched input and the output with Explicit axes.
STAGES_IN = ("activation_stage", "activation_batch", "activation_length", "activation_embed")
STATE_IO = ("activation_stage", None, "activation_batch", "activation_length", "activation_embed")
_MICROBATCHES = (None, "activation_batch", "activation_length", "activation_embed")
_OUTPUT = ("activation_batch", "activation_length", "activation_embed")


@dataclass(frozen=True)
class _Schedule:
    """MaxText's pipeline schedule (`layers/pipeline.py`) over `stages` stages: `microbatches · repeats +
    stages - 1` iterations, in each of which every stage runs its layers of the current visit on its input.

    The microbatches sit in `state_io`, `microbatches / stages` to a stage, and move through it like a
    conveyor: at iteration i every stage hands its slot i mod (microbatches / stages) to the stage before it,
    stage 0's slot feeds the first stage, and the last stage puts its output in the slot it gave up. Stage s's
    output goes to stage s + 1 through `shift`. In a circular schedule what the last stage sends round waits
    in `circ_storage` for its microbatch's next visit (when there are more microbatches than stages; else
    `shift` carries it straight to stage 0). After the last iteration `state_io` holds the outputs, rotated by
    the bubble."""

    axis: str
    stages: int
    microbatches: int
    repeats: int

    @property
    def per_stage(self) -> int:
        return self.microbatches // self.stages

    @property
    def iterations(self) -> int:
        """Each microbatch's visits, one an iteration, plus the bubble."""
        return self.microbatches * self.repeats + self.stages - 1

    def visit(self, step: jax.Array, stage: jax.Array) -> jax.Array | None:
        """Which of its visits a stage runs at an iteration (None: the schedule has one); in the bubble, the
        nearest (its results are never used)."""
        if self.repeats == 1:
            return None
        return jnp.clip((step - stage) // self.microbatches, 0, self.repeats - 1)

    @property
    def stores_outputs(self) -> bool:
        """Whether outputs wait in `circ_storage` between visits (MaxText's `use_circ_storage`)."""
        return self.repeats > 1 and self.microbatches > self.stages

    def start(self, context: ShardingContext, path: tuple[str, ...], x: jax.Array) -> LoopBuffers:
        """The loop state before the first iteration, from the stack's input [batch, seq, embed]; `state_io`
        and `shift` are recorded under `path` with MaxText's logical axes."""
        micro = x.shape[0] // self.microbatches
        on_stages = functools.partial(_on_stage_axis, self.axis)
        inside = context.resolve(STAGES_IN)[1:]
        if any(self.axis in entry_axes(entry) for entry in inside):
            raise ValueError(f"activations inside a pipeline stage must not be split over {self.axis!r}: {inside}")
        # Contiguous microbatches, as MaxText splits the batch (rows m·micro … (m + 1)·micro - 1).
        x = _reshape_as(context, x, (self.microbatches, micro, *x.shape[1:]), _MICROBATCHES)
        state_io = _reshape_as(context, x, (self.stages, self.per_stage, *x.shape[1:]), STATE_IO, on_stages)
        state_io = constrain(path, "state_io", state_io, STATE_IO, on_stages)
        shift = constrain(path, "shift", jnp.zeros((self.stages, *x.shape[1:]), x.dtype), STAGES_IN, on_stages)
        if not self.stores_outputs:
            return LoopBuffers(state_io, shift, None, None)
        stored = jnp.zeros((self.stages, *x.shape), x.dtype)
        stored = place(context, stored, on_stages(context.resolve(STATE_IO)))
        return LoopBuffers(state_io, shift, stored, shift)

    def advance(
        self, loop: LoopBuffers, step: jax.Array, stage: jax.Array, run: Callable[[jax.Array], jax.Array]
    ) -> LoopBuffers:
        """One iteration on one stage's slice of the loop state (inside the shard_map over the stage axis):
        `run` applies the stage's layers of this visit."""
        first, last = stage == 0, stage == self.stages - 1
        right = [(s, (s + 1) % self.stages) for s in range(self.stages)]
        left = [(s, (s - 1) % self.stages) for s in range(self.stages)]
        slot = step % self.per_stage
        stream = loop.state_io[slot]
        # Stage 0 takes a fresh microbatch while there are any, then one coming round for its next visit.
        # Scalar selects: a predicate broadcast to a buffer's shape would be kept for every step.
        came_round = loop.shift if loop.circ_storage is None else loop.circ_storage[step % self.microbatches]
        hidden = jax.lax.select(first, jax.lax.select(step < self.microbatches, stream, came_round), loop.shift)
        # (MaxText's pipeline remat policy also keeps each iteration's input, `iteration_input`: with one layer
        # a visit that is the layer's own kept input, and with several the first one's.)
        out = run(hidden)
        sent = jax.lax.ppermute(out, self.axis, right)
        # The last stage's output goes round to stage 0 only when it is needed there at once.
        goes_round = self.repeats > 1 and not self.stores_outputs
        shift = sent if goes_round else jax.lax.select(first, jnp.zeros_like(sent), sent)
        stored, mover = loop.circ_storage, loop.circ_mover
        if stored is not None and mover is not None:
            # Last iteration's output goes into storage now (MaxText's one-iteration delay), at the slot of
            # its microbatch.
            slot_of = (step - self.stages) % self.microbatches
            stored = jax.lax.dynamic_update_index_in_dim(stored, jax.lax.ppermute(mover, self.axis, right), slot_of, 0)
            mover = out
        handed = jax.lax.select(last, out, jax.lax.ppermute(stream, self.axis, left))
        return LoopBuffers(jax.lax.dynamic_update_index_in_dim(loop.state_io, handed, slot, 0), shift, stored, mover)

    def finish(self, context: ShardingContext, state_io: jax.Array) -> jax.Array:
        """The stack's output [batch, seq, embed] from the last `state_io`, the bubble's rotation undone."""
        first = (self.microbatches * (self.repeats - 1) + self.stages - 1) % self.per_stage
        outputs = state_io[:, (np.arange(self.per_stage) + first) % self.per_stage]
        batch = self.microbatches * outputs.shape[2]
        return _reshape_as(context, outputs, (batch, *outputs.shape[3:]), _OUTPUT)


def _on_stage_axis(axis: str, spec: PartitionSpec) -> PartitionSpec:
    """`spec` with its first dimension on the stage axis (the loop state is split over it, whatever the rules
    say of `activation_stage`)."""
    entries = tuple(spec)
    if entries and axis in entry_axes(entries[0]):
        return spec
    return PartitionSpec(axis, *entries[1:])


def _reshape_as(
    context: ShardingContext,
    x: jax.Array,
    shape: tuple[int, ...],
    logical: tuple[str | None, ...],
    adjust: Callable[[PartitionSpec], PartitionSpec] = lambda spec: spec,
) -> jax.Array:
    """A reshape as MaxText's pipeline makes it: with Explicit axes onto the sharding of `logical`; with Auto
    axes unconstrained."""
    if not context.explicit:
        return x.reshape(shape)
    return jax.lax.reshape(x, shape, out_sharding=adjust(context.resolve(logical)))


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
