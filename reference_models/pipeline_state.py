"""MaxText's pipeline schedule and loop state (`layers/pipeline.py`): where each microbatch is at every
iteration, and how the buffers that hold them move between stages.

Each buffer is a global array with a leading stage dimension split over the stage axis. The moves between
stages are written per device, as MaxText writes them: small shard_maps over the whole mesh whose ppermutes
become collective-permutes over the stage axis; everything else is a global computation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from reference_models.sharding import ShardingContext, ambient_mesh, constrain, entry_axes, place


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
class Schedule:
    """MaxText's pipeline schedule over `stages` stages: `microbatches · repeats + stages - 1` iterations, in
    each of which every stage runs its layers of the current visit on its input.

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

    @property
    def stores_outputs(self) -> bool:
        """Whether outputs wait in `circ_storage` between visits (MaxText's `use_circ_storage`)."""
        return self.repeats > 1 and self.microbatches > self.stages

    def repeat_ids(self, step: jax.Array) -> jax.Array:
        """Which of its visits each stage runs at an iteration, [stages] (in the bubble, past the last: the
        slice that picks it clamps to the last)."""
        processed = jnp.maximum(step - jnp.arange(self.stages), 0)
        return processed // self.microbatches

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
        stored = place(context, stored, self.state_io_spec(context))
        return LoopBuffers(state_io, shift, stored, shift)

    def stages_in_spec(self, context: ShardingContext) -> PartitionSpec:
        return _on_stage_axis(self.axis, context.resolve(STAGES_IN))

    def state_io_spec(self, context: ShardingContext) -> PartitionSpec:
        return _on_stage_axis(self.axis, context.resolve(STATE_IO))

    def stage_inputs(self, context: ShardingContext, loop: LoopBuffers, step: jax.Array) -> jax.Array:
        """Every stage's input at iteration `step`, [stages, micro, seq, embed]: stage 0's a fresh microbatch
        from `state_io` while there are any, then one coming round for its next visit; the others' what
        the stage before them sent (MaxText's `get_iteration_inputs`)."""
        spec = self.stages_in_spec(context)
        fresh = loop.state_io[:, step % self.per_stage]
        shift = place(context, loop.shift, spec)
        came_round = shift if loop.circ_storage is None else loop.circ_storage[:, step % self.microbatches]
        first = place(context, jnp.where(step < self.microbatches, fresh, came_round), spec)
        stage = jax.lax.broadcasted_iota(jnp.int32, shift.shape, 0, out_sharding=spec if context.explicit else None)
        return place(context, jnp.where(stage == 0, first, shift), spec)

    def advance(self, context: ShardingContext, loop: LoopBuffers, out: jax.Array, step: jax.Array) -> LoopBuffers:
        """The loop state after an iteration whose stages output `out` (MaxText's `get_new_loop_state`):
        `shift` carries each output to the next stage, `circ_storage` takes last iteration's from the last
        stage, and `state_io` moves its current slot one stage back, the last stage's output filling it."""
        stages_in, state_io_spec = self.stages_in_spec(context), self.state_io_spec(context)
        mesh = ambient_mesh(context)
        right = [(s, (s + 1) % self.stages) for s in range(self.stages)]
        left = [(s, (s - 1) % self.stages) for s in range(self.stages)]
        axis = self.axis

        @functools.partial(jax.shard_map, mesh=mesh, in_specs=stages_in, out_specs=stages_in)
        def rotate_right(x: jax.Array) -> jax.Array:
            return jax.lax.ppermute(x, axis, right)

        @functools.partial(jax.shard_map, mesh=mesh, in_specs=stages_in, out_specs=stages_in)
        def shift_right(x: jax.Array) -> jax.Array:
            moved = jax.lax.ppermute(x, axis, right)
            return jnp.where(jax.lax.axis_index(axis) == 0, jnp.zeros_like(moved), moved)

        # The last stage's output goes round to stage 0 at once only when it is needed there at once.
        shift = rotate_right(out) if self.repeats > 1 and not self.stores_outputs else shift_right(out)
        stored, mover = loop.circ_storage, loop.circ_mover
        if stored is not None and mover is not None:
            # Last iteration's output goes into storage now (MaxText's one-iteration delay), at the slot of
            # its microbatch.
            slot_of = (step - self.stages) % self.microbatches
            stored = jax.lax.dynamic_update_slice_in_dim(stored, rotate_right(mover)[:, None], slot_of, axis=1)
            mover = out
        slot = step % self.per_stage

        @functools.partial(
            jax.shard_map,
            mesh=mesh,
            in_specs=(state_io_spec, stages_in, stages_in, PartitionSpec()),
            out_specs=state_io_spec,
        )
        def hand_back(state_io: jax.Array, current: jax.Array, output: jax.Array, slot: jax.Array) -> jax.Array:
            moved = jax.lax.ppermute(current, axis, left)
            handed = jnp.where(jax.lax.axis_index(axis) == self.stages - 1, output, moved)
            return jax.lax.dynamic_update_slice_in_dim(state_io, handed[:, None], slot, axis=1)

        state_io = hand_back(loop.state_io, loop.state_io[:, slot], out, slot)
        return LoopBuffers(state_io, shift, stored, mover)

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
