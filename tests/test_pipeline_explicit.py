"""A circular pipeline with Explicit axes is MaxText's explicit pipeline (seed 003): with its weights gathered over
fsdp once, each iteration's gradient of a visit's weights goes to the weights as they are stored (split over
fsdp), as MaxText's compile of seed 003 has it: every iteration scatters the visit's gradient into a buffer of
all the visits (zeros, then the visit's slot), takes this device's share of that and adds it into the split
gradient. The cost model prices that buffer as the TPU keeps it (the CPU compiler fuses it away: see
`shardscope.hlo.work`); with Auto axes the gradient is updated in place."""

from __future__ import annotations

import pytest

from shardscope.case import resolve_case
from shardscope.hlo.module import read_module
from shardscope.hlo.profile import work_profile

FSDP = {"data": 1, "stage": 2, "fsdp": 2, "expert": 2}
STAGE_ONLY = {"data": 4, "stage": 2, "fsdp": 1, "expert": 1}
REPEATS = 2
PIPELINED = "params/decoder/pipeline_module/layers/"  # MaxText's pipeline layout of the stack


def scattered_buffer_bytes(compile_cached, mode: str, mesh: dict[str, int]) -> int:
    """Bytes per step of the buffers the compiled step's fusions scatter into and read a slice of back (the
    work profile's `buffer` bins: `shardscope.hlo.work.materialised_scatter_bytes`), with the weights
    gathered once."""
    overrides = {"pipeline.repeats": str(REPEATS), "pipeline.microbatches": "2", "shard_mode": mode}
    overrides["pipeline.fsdp_gather_once"] = "true"
    step = compile_cached(resolve_case("llama-tiny", "explicit-pipeline", mesh=mesh, overrides=overrides))
    profile = work_profile(read_module(step.compiled.as_text()), cpu_program=True)
    return sum(entry.bytes for entry in profile if entry.kind == "buffer")


def test_explicit_gathered_once_adds_each_visits_gradient_into_the_stored_split(compile_cached):
    assert scattered_buffer_bytes(compile_cached, "explicit", FSDP) > 0


@pytest.mark.parametrize(("mode", "mesh"), [("auto", FSDP), ("explicit", STAGE_ONLY)])
def test_otherwise_the_gradient_is_updated_in_place(compile_cached, mode, mesh):
    assert scattered_buffer_bytes(compile_cached, mode, mesh) == 0


@pytest.mark.parametrize(("mode", "gathers_each_iteration"), [("auto", True), ("explicit", False)])
def test_gathered_once_the_schedule_gathers_no_weight_over_fsdp(mode, gathers_each_iteration, plan_of):
    # With Auto axes and without it every iteration of the schedule's loop gathers its visit's weights over
    # fsdp (the slice that picks the visit is what they gather); with it the weights are gathered once,
    # outside. With Explicit axes and without it each iteration places all the visits' weights on the stage
    # axis alone (MaxText's `shard_dim_by_stages` without a spec): a computation on the loop's invariant
    # weights, which the scan hoists out of the loop, so they are gathered once too.
    def weight_gathers_in_loop(once: bool) -> int:
        overrides = {"pipeline.repeats": str(REPEATS), "pipeline.microbatches": "2", "shard_mode": mode}
        overrides["pipeline.fsdp_gather_once"] = str(once).lower()
        plan = plan_of(resolve_case("llama-tiny", "explicit-pipeline", mesh=FSDP, overrides=overrides))
        return sum(
            1
            for row in plan.collectives
            if row.op == "all-gather" and "fsdp" in (row.axes or ()) and (row.loop_trips or 1) > 1
        )

    assert (weight_gathers_in_loop(False) > 0) == gathers_each_iteration
    assert weight_gathers_in_loop(True) == 0


def _visit_gradient_bytes(plan_of, mode: str, mesh: dict[str, int]) -> tuple[int, int]:
    """(bytes the prediction adds for the visit-gradient buffers; per step, over each FSDP-split stage weight
    as a device stores it: g + 2g/repeats passes for the buffer of all the visits, g the split's size, and 3
    for the add into the gradient; over a stage weight stored whole, the add into its visit's slot, 3 passes
    of one visit: counted from the plan's tensors)."""
    from shardscope.predict.layout import placement_of
    from shardscope.predict.measure import tensors_only
    from shardscope.predict.work import _visit_gradients

    overrides = {"pipeline.repeats": str(REPEATS), "pipeline.microbatches": "2", "shard_mode": mode}
    plan = tensors_only(plan_of(resolve_case("llama-tiny", "explicit-pipeline", mesh=mesh, overrides=overrides)))
    placement = placement_of(plan)
    added = sum(entry.bytes for entry in _visit_gradients(plan, placement.weights, placement.case))
    steps = 2 * REPEATS + 2 - 1
    stacked = [record for path, record in plan.tensors if record.kind == "param" and path.startswith(PIPELINED)]
    if mode == "auto":
        # With Auto axes the pick at a traced index updates a buffer of every stacked weight, as the layers
        # use it (here the weights' own dtype: the tiny model runs in float32): read and written per step.
        assert {r.dtype for r in stacked} == {placement.case.model.dtype}
        return added, 2 * steps * sum(record.bytes_per_device for record in stacked)
    expected = 0
    for record in stacked:
        axes = {a for e in record.spec if e for a in (e if isinstance(e, tuple) else (e,))} - {"stage"}
        gathered = 1
        for axis in axes:
            gathered *= mesh[axis]
        passes = 3 + gathered * (1 + 2 / REPEATS) if gathered > 1 else 3 / REPEATS
        expected += steps * round(passes * record.bytes_per_device)
    return added, expected


def test_the_prediction_counts_the_visit_gradient_buffers(plan_of):
    added, expected = _visit_gradient_bytes(plan_of, "explicit", FSDP)
    assert expected > 0 and added == expected
    added, expected = _visit_gradient_bytes(plan_of, "explicit", STAGE_ONLY)
    assert expected > 0 and added == expected
    added, expected = _visit_gradient_bytes(plan_of, "auto", FSDP)
    assert expected > 0 and added == expected
