"""A circular pipeline with Explicit axes is MaxText's explicit pipeline (seed 003): with its weights gathered over
fsdp once, each iteration's gradient of a visit's weights goes to the weights as they are stored (split over
fsdp), as MaxText's compile of seed 003 has it: every iteration scatters the visit's gradient into a buffer of
all the visits (zeros, then the visit's slot), takes this device's share of that and adds it into the split
gradient. The cost model prices that buffer as the TPU keeps it (the CPU compiler fuses it away: see
`shardscope.hlo.work`); with Auto axes the gradient is updated in place."""

from __future__ import annotations

import math
import re

import pytest

from shardscope.case import resolve_case
from shardscope.hlo.module import read_module
from shardscope.hlo.profile import work_profile

# The quick lane (`-m "not slow"`) leaves these out: pipelined steps compiled.
pytestmark = pytest.mark.slow

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


def _prediction_bytes(plan_of, mode: str, mesh: dict[str, int]) -> tuple[int, int, int, int]:
    """(bytes the prediction adds for the visit gradients, those expected; bytes it adds for the loop state,
    those expected), counted from the plan's tensors and case.

    Visit gradients, with Explicit axes only, per step: over each FSDP-split stage weight as a device stores
    it, g + 2g/repeats passes for the buffer of all the visits (g the split's size) and 3 for the add into the
    gradient; over a stage weight stored whole, the add into its visit's slot, 3 passes of one visit; and the
    visit converted for its float32 sum, 1.5 passes of one gathered visit computed in bfloat16 (none computed in
    float32: nothing to convert). With Auto axes nothing (the TPU adds
    the partial sums inside the matmuls). Loop state: 4 passes per iteration over the stage's share of the
    microbatches, the circular storage of all of them and the shift buffer."""
    from shardscope.predict.layout import placement_of
    from shardscope.predict.measure import tensors_only
    from shardscope.predict.pipeline_work import loop_state, visit_gradients

    overrides = {"pipeline.repeats": str(REPEATS), "pipeline.microbatches": "2", "shard_mode": mode}
    plan = tensors_only(plan_of(resolve_case("llama-tiny", "explicit-pipeline", mesh=mesh, overrides=overrides)))
    placement = placement_of(plan)
    case = placement.case
    added = sum(entry.bytes for entry in visit_gradients(plan, placement.weights, case))
    state = sum(entry.bytes for entry in loop_state(plan, placement.weights, case, placement.micro_tokens))
    steps = 2 * REPEATS + 2 - 1
    microbatches = 2 // mesh["stage"] + 2 + 1  # state_io's share, the circular storage, the shift buffer
    itemsize = 4 if case.model.dtype == "float32" else 2
    expected_state = 4 * steps * microbatches * placement.micro_tokens * case.model.embed_dim * itemsize
    stacked = [record for path, record in plan.tensors if record.kind == "param" and path.startswith(PIPELINED)]
    expected = 0
    for record in stacked if mode == "explicit" else ():
        axes = {a for e in record.spec if e for a in (e if isinstance(e, tuple) else (e,))} - {"stage"}
        gathered = 1
        for axis in axes:
            gathered *= mesh[axis]
        passes = 3 + gathered * (1 + 2 / REPEATS) if gathered > 1 else 3 / REPEATS
        converted = 1.5 if itemsize == 2 else 0.0
        expected += steps * round((passes + converted * gathered / REPEATS) * record.bytes_per_device)
    return added, expected, state, expected_state


def test_the_prediction_counts_the_visit_gradients_and_the_loop_state(plan_of):
    for mode, mesh in (("explicit", FSDP), ("explicit", STAGE_ONLY), ("auto", FSDP)):
        added, expected, state, expected_state = _prediction_bytes(plan_of, mode, mesh)
        assert added == expected and (expected > 0) == (mode == "explicit")
        assert state == expected_state > 0


def test_explicit_output_head_runs_on_the_logits_split_of_the_batch(compile_cached):
    # MaxText gives the output head's matmul the logits' sharding (`activation_embed_and_logits_batch`, the
    # stage axis among its axes) as its out_sharding: the matmul runs on that split of the batch, not on the
    # pipeline output's (which the stage axis does not split), and no device computes another's logits.
    overrides = {"pipeline.repeats": str(REPEATS), "pipeline.microbatches": "2", "shard_mode": "explicit"}
    case = resolve_case("llama-tiny", "explicit-pipeline", mesh=FSDP, overrides=overrides)
    text = compile_cached(case).compiled.as_text()
    vocab = case.model.vocab_size
    forward = re.compile(rf"= \w+\[(\d+),\d+,{vocab}\]\S* \w+\(.*jvp\(\w+\)/decoder/logits_dense/dot_general")
    batches = {
        int(m.group(1)) for line in text.splitlines() if (m := forward.search(line)) and "transpose(" not in line
    }
    logits_batch = dict(case.preset.logical_axis_rules)["activation_embed_and_logits_batch"]
    assert "stage" in logits_batch
    assert batches == {case.global_batch // math.prod(FSDP[axis] for axis in logits_batch)}
