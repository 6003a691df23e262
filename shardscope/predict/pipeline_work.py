"""A pipeline's own HBM work in a step: the loop state it carries, and a circular pipeline's visit gradients.

Every pass count here is counted from the program's structure, none is fitted: the fitting set
(`benchmarks/fitting_set.yaml`) holds no pipelined run, so no measured step could determine them
(`benchmarks/calibrate.py` says so in `benchmarks/CALIBRATION.md`, beside each count and where it comes
from). Seed 003's four compiles are validation runs: the counts are checked against them
(`benchmarks/prediction.py runs`), never read off them.

A pipelined stack's loop runs once per iteration (microbatches × repeats + stages − 1: the bubble
included). Everything here is per device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardscope.case.resolve import Case
from shardscope.case.rules import entry_axes
from shardscope.hlo.profile import WorkBin, WorkKind
from shardscope.plan.document import Plan
from shardscope.predict.layout import Weight, mesh_sizes, moved_dtype, nbytes

# An elementwise op over operands of its result's size reads each operand once and writes its result once.
READ, WRITE = 1, 1
# Passes over a weight's gradient (as a device stores it) when a step's visit gradient is added into it: an
# add, of two operands (the stored gradient, and the visit's share sliced from the buffer that holds it),
# each read, and its result written back.
VISIT_GRADIENT_PASSES = 2 * READ + WRITE
# Passes per iteration over what a pipeline's loop carries (`_carried`): the iteration's inputs read from it
# and its new state written (MaxText's `get_iteration_inputs`, `get_new_loop_state`), in the forward loop
# and again in its transpose, the backward loop (half of them in each pass).
LOOP_STATE_PASSES = 2 * (READ + WRITE)


def conversion_passes(computed: str, stored: str) -> float:
    """Passes, in the stored weight's bytes, over one visit's gradient converted for a sum in the stored
    dtype: read in the dtype it was computed in and written in the stored one (bfloat16 computed for a
    float32 weight: half a pass read, one written, 1.5); none where it was computed in the stored dtype
    (no conversion)."""
    if computed == stored:
        return 0.0
    return READ * nbytes((1,), computed) / nbytes((1,), stored) + WRITE


@dataclass(frozen=True)
class Count:
    """One pass count with what it counts, as `benchmarks/CALIBRATION.md` records it."""

    name: str
    value: float
    counts: str


def counts() -> tuple[Count, ...]:
    """Every pass count of this module (a function: the conversion's reads the dtypes' sizes)."""
    return (
        Count(
            "VISIT_GRADIENT_PASSES",
            VISIT_GRADIENT_PASSES,
            "an add of a step's visit gradient into a weight's stored gradient: two operands read, the sum written",
        ),
        Count(
            "conversion_passes(bfloat16, float32)",
            conversion_passes("bfloat16", "float32"),
            "a visit's gradient converted for its sum: read as computed (half the stored bytes), written as stored",
        ),
        Count(
            "LOOP_STATE_PASSES",
            LOOP_STATE_PASSES,
            "what a pipeline's loop carries, read (the iteration's inputs) and written (its new state) every "
            "iteration, in the forward loop and in its transpose",
        ),
    )


def visit_gradients(plan: Plan, every: tuple[Weight, ...], case: Case | None) -> list[WorkBin]:
    """A circular pipeline's per-step passes over its stage's weights with Explicit axes, where the program
    sums each step's visit gradient itself, in the stored dtype (`conversion_passes`), and adds it into the
    stored gradient. Split beyond the stage axis (FSDP), MaxText's program makes the step's weight gradient a
    buffer of every visit's weights as gathered (zeros written, the step's visit scattered in, read and
    written: g + 2g/repeats passes over the weight as stored, g the gathered axes' size), of which this
    device's share is added into the split gradient (`VISIT_GRADIENT_PASSES`); stored whole (ZeRO-1: its axis
    splits the optimizer's copy only, the gradient is whole), each step's visit gradient is added into its
    own visit's slot. With Auto axes the TPU adds the partial sums inside the matmuls that make them and
    sums them once after the loop (`shardscope.hlo.accumulation`): nothing here."""
    pipeline = None if case is None else case.preset.pipeline
    if case is None or pipeline is None or pipeline.repeats < 2 or case.preset.shard_mode != "explicit":
        return []
    sizes = mesh_sizes(plan)
    bins = []
    for weight in every:
        if not weight.stack_axes:
            continue
        # ZeRO-1's axis splits the stored weights only: the step gathers them back before the pipeline.
        spec_axes = {axis for entry in weight.record.spec for axis in entry_axes(entry)}
        split = spec_axes - set(weight.stack_axes) - {case.preset.shard_optimizer_over}
        gathered = math.prod(sizes.get(axis, 1) for axis in split)
        whole = sizes.get(case.preset.shard_optimizer_over, 1) if case.preset.shard_optimizer_over in spec_axes else 1
        stored = weight.record.dtype
        converted = conversion_passes(moved_dtype(stored, case.model.dtype), stored) * gathered * whole
        converted /= pipeline.repeats
        if gathered == 1:
            # Stored whole (ZeRO-1), the visit's gradient is added into its own slot of the stored
            # gradient: the slot read, the visit's gradient read, the slot written (one of `repeats`).
            passes = VISIT_GRADIENT_PASSES * whole / pipeline.repeats
        else:
            passes = VISIT_GRADIENT_PASSES + gathered * (WRITE + (READ + WRITE) / pipeline.repeats)
        per_step = round((passes + converted) * weight.record.bytes_per_device)
        trips = weight.loop_trips
        bins.append(WorkBin(WorkKind.MEMORY, "backward", trips, None, trips, 0, per_step * trips, trips))
    return bins


def _carried(microbatches: int, repeats: int, stages: int) -> int:
    """The microbatches' activations a pipeline's loop carries: `state_io`, the stage's share of them; with
    repeats, the circular storage of every microbatch; and the shift buffer, one."""
    return microbatches // stages + (microbatches if repeats > 1 else 0) + 1


def loop_state(plan: Plan, every: tuple[Weight, ...], case: Case | None, micro: int) -> list[WorkBin]:
    """A pipeline's loop state read and written at every iteration (`LOOP_STATE_PASSES` over what it carries,
    each microbatch `micro` tokens of the model's width)."""
    pipeline = None if case is None else case.preset.pipeline
    staged = next((w for w in every if w.stack_axes), None)
    if case is None or pipeline is None or staged is None:
        return []
    stages = mesh_sizes(plan).get(pipeline.stage_axis, 1)
    carried = _carried(pipeline.microbatches, pipeline.repeats, stages)
    state = carried * micro * case.model.embed_dim * nbytes((1,), case.model.dtype)
    trips = staged.loop_trips
    per_pass = round(LOOP_STATE_PASSES / 2 * state * trips)
    return [
        WorkBin(WorkKind.MEMORY, pass_, trips, None, trips, 0, per_pass, trips) for pass_ in ("forward", "backward")
    ]
