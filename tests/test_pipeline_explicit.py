"""A circular pipeline with Explicit axes is MaxText's explicit pipeline: each step picks its visit's weights
out of all of a stage's layers, and when those weights are split over FSDP too, the step's gradient becomes a
buffer of every visit's weights, materialised and added into the gradient at every step (MaxText's compile of
seed 003 moves 2.7 TB more HBM traffic per step that way than its Auto twin; the published-runs benchmark
prices the TPU compile of that run). Weights split over the stage axis alone take the gradient in place."""

from __future__ import annotations

import re

import pytest

from shardscope.case import resolve_case
from shardscope.stages.compile import lower_case

FSDP = {"data": 1, "stage": 2, "fsdp": 2, "expert": 2}
STAGE_ONLY = {"data": 4, "stage": 2, "fsdp": 1, "expert": 1}
REPEATS = 2
PIPELINED = "params/decoder/pipeline_module/layers/"  # MaxText's pipeline layout of the stack


def barrier_shapes(mode: str, mesh: dict[str, int], once: bool = False) -> list[str]:
    """The types of the single values the lowered step (StableHLO text) puts behind an optimization barrier
    (remat's barriers hold several values at once). `once`: the weights gathered over fsdp before the
    schedule (MaxText's pipeline_fsdp_ag_once)."""
    overrides = {"pipeline.repeats": str(REPEATS), "pipeline.microbatches": "2", "shard_mode": mode}
    overrides["pipeline.fsdp_gather_once"] = str(once).lower()
    text = lower_case(resolve_case("llama-tiny", "explicit-pipeline", mesh=mesh, overrides=overrides)).lowered.as_text()
    return re.findall(r"= stablehlo\.optimization_barrier %[\w#.]+ : (tensor<[^>]*>)\n", text)


def test_fsdp_split_weights_take_every_visits_gradient_every_step():
    shapes = barrier_shapes("explicit", FSDP)
    # One materialised buffer per main-stack weight, each with every visit's copy (leading dimension).
    assert shapes and all(shape.startswith(f"tensor<{REPEATS}x") for shape in shapes)


def test_weights_gathered_once_still_take_every_visits_gradient_every_step():
    # MaxText's compile of seed 003 (pipeline_fsdp_ag_once=true, FSDP-stored weights) has the buffer: it
    # follows the weights' stored split, not the gathered one the schedule reads.
    shapes = barrier_shapes("explicit", FSDP, once=True)
    assert shapes and all(shape.startswith(f"tensor<{REPEATS}x") for shape in shapes)


@pytest.mark.parametrize("mode", ["auto", "explicit"])
def test_gathered_once_the_schedule_gathers_no_weight_over_fsdp(mode, plan_of):
    # Without it every step of the schedule's loop gathers its layer's weights over fsdp (the select or index
    # that picks the visit's layer is what they gather); with it the weights are gathered once, outside.
    def weight_gathers_in_loop(once: bool) -> int:
        overrides = {"pipeline.repeats": str(REPEATS), "pipeline.microbatches": "2", "shard_mode": mode}
        overrides["pipeline.fsdp_gather_once"] = str(once).lower()
        plan = plan_of(resolve_case("llama-tiny", "explicit-pipeline", mesh=FSDP, overrides=overrides))
        return sum(
            1
            for row in plan.collectives
            if row.op == "all-gather" and "fsdp" in (row.axes or ()) and (row.loop_trips or 1) > 1
        )

    assert weight_gathers_in_loop(False) > 0
    assert weight_gathers_in_loop(True) == 0


@pytest.mark.parametrize(("mode", "mesh"), [("explicit", STAGE_ONLY), ("auto", FSDP)])
def test_otherwise_the_gradient_stays_in_place(mode, mesh):
    assert barrier_shapes(mode, mesh) == []


def _visit_gradient_bytes(plan_of, mode: str, mesh: dict[str, int]) -> tuple[int, int]:
    """(bytes the prediction adds for the visit-gradient buffers, 4 passes over each FSDP-split stage weight
    per step, counted from the plan's tensors)."""
    from shardscope.predict.layout import placement_of
    from shardscope.predict.measure import tensors_only
    from shardscope.predict.work import _visit_gradients

    overrides = {"pipeline.repeats": str(REPEATS), "pipeline.microbatches": "2", "shard_mode": mode}
    plan = tensors_only(plan_of(resolve_case("llama-tiny", "explicit-pipeline", mesh=mesh, overrides=overrides)))
    placement = placement_of(plan)
    added = sum(entry.bytes for entry in _visit_gradients(plan, placement.weights, placement.case))
    steps = 2 * REPEATS + 2 - 1
    split = [
        record
        for path, record in plan.tensors
        if record.kind == "param"
        and path.startswith(PIPELINED)
        and any("fsdp" in (e if isinstance(e, tuple) else (e,)) for e in record.spec if e)
    ]
    if mode == "auto":
        # With Auto axes the pick at a traced index updates a buffer of every stacked weight, as the layers
        # use it (here the weights' own dtype: the tiny model runs in float32): read and written per step.
        stacked = [r for p, r in plan.tensors if r.kind == "param" and p.startswith(PIPELINED)]
        assert {r.dtype for r in stacked} == {placement.case.model.dtype}
        return added, 2 * steps * sum(record.bytes_per_device for record in stacked)
    return added, 4 * steps * sum(record.bytes_per_device for record in split)


def test_the_prediction_counts_the_visit_gradient_buffers(plan_of):
    added, expected = _visit_gradient_bytes(plan_of, "explicit", FSDP)
    assert expected > 0 and added == expected
    assert _visit_gradient_bytes(plan_of, "explicit", STAGE_ONLY)[0] == 0
    added, expected = _visit_gradient_bytes(plan_of, "auto", FSDP)
    assert expected > 0 and added == expected
