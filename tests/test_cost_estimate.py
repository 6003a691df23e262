"""Estimates of the checked-in golden plans: row times, totals, step bounds, memory, multi-slice traffic,
and the JSON round trip."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from shardscope.case.hardware import HardwareError
from shardscope.cost import (
    compute_time,
    cost_figures,
    estimate_from_json,
    estimate_plan,
    estimate_to_json,
    layout_for,
    load_hardware,
)
from shardscope.cost.dcn import SOURCE
from shardscope.errors import PlanError
from shardscope.golden.store import load_golden
from shardscope.plan.estimate import ESTIMATED, EXACT

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "deepseek-tiny"
V5P = load_hardware("v5p")


@pytest.fixture(scope="module")
def v5p_plan():
    return load_golden(GOLDEN / "v5p-16" / "ep-as-cp.json")


def _estimate(plan, hardware=V5P, slices=1, **kwargs):
    return estimate_plan(plan, hardware, layout_for(hardware, plan.case.mesh, slices=slices), **kwargs)


def test_v5p_plan_totals_are_the_sum_of_its_rows(v5p_plan):
    estimate = _estimate(v5p_plan)
    assert len(estimate.rows) == len(v5p_plan.collectives) and estimate.unpriced_rows == 0
    total = sum(row.seconds for row in estimate.rows)
    assert estimate.communication == pytest.approx(total)
    for totals in (estimate.by_axes, estimate.by_op, estimate.by_pass):
        assert sum(seconds for _, seconds in totals) == pytest.approx(total)
    assert {axes for axes, _ in estimate.by_axes} == {"expert", "fsdp", "fsdp+expert"}
    per_axes: dict[str, float] = {}
    for row, time in zip(v5p_plan.collectives, estimate.rows, strict=True):
        key = "+".join(row.axes)
        per_axes[key] = per_axes.get(key, 0.0) + time.seconds
    assert dict(estimate.by_axes) == pytest.approx(per_axes)


def test_one_row_by_hand(v5p_plan):
    """The MoE all-to-all over `expert` (64 KiB, 4 trips). v5p-16 is 2x2x2 chips without wraparound;
    `expert` is one link between two chips: each sends half its buffer over it at 9e10 B/s, one hop
    of 1 us, at the table's efficiency 0.82."""
    index, row = next((i, r) for i, r in enumerate(v5p_plan.collectives) if r.op == "all-to-all" and r.bytes == 65536)
    assert (row.axes, row.count, row.loop_trips) == (("expert",), 1, 4)
    expected = (1e-6 + 65536 / 2 / 9e10 / 0.82) * 4
    assert _estimate(v5p_plan).rows[index].seconds == pytest.approx(expected, rel=1e-12)


def test_tpu7x_prices_its_expert_axis_on_the_chip_link():
    plan = load_golden(GOLDEN / "tpu7x-8" / "ep-as-cp.json")
    hw = load_hardware("tpu7x")
    estimate = _estimate(plan, hw)
    index = next(i for i, r in enumerate(plan.collectives) if r.op == "all-to-all" and r.axes == ("expert",))
    row = plan.collectives[index]
    one = 1e-6 + row.bytes / 2 / hw.chip_link_bandwidth / hw.efficiency
    assert estimate.rows[index].seconds == pytest.approx(one * row.count * row.loop_trips)


def test_tpu_memory_is_the_compilers_and_cpu_memory_is_estimated(v5p_plan):
    memory = dict(v5p_plan.memory)
    exact = _estimate(v5p_plan).memory
    assert exact.source == EXACT and exact.exact
    # The need is the compiler's peak, below the static sum of its figures (which adds temporaries never
    # alive together).
    static = memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"] + memory["temp_bytes"]
    assert exact.total == memory["peak_bytes"] < static
    assert dict(exact.categories)["temp_at_peak"] == (
        memory["peak_bytes"] - memory["argument_bytes"] - (memory["output_bytes"] - memory["alias_bytes"])
    )
    # A TPU plan made before the peak was recorded: the static sum.
    older = dataclasses.replace(v5p_plan, memory=tuple((k, v) for k, v in v5p_plan.memory if k != "peak_bytes"))
    assert _estimate(older).memory.total == static
    assert exact.capacity == 95 * 2**30 and exact.fits and exact.over == 0

    cpu = load_golden(GOLDEN / "cpu-8" / "ep-as-cp.json")
    estimated = _estimate(cpu).memory
    assert estimated.source == ESTIMATED and not estimated.exact
    by_kind: dict[str, int] = {}
    block_sums = {"dense_layers": 0, "moe_layers": 0}
    for path, tensor in cpu.tensors:
        by_kind[tensor.kind] = by_kind.get(tensor.kind, 0) + tensor.bytes_per_device
        if tensor.kind == "activation":
            block_sums[path.split("/")[2]] += tensor.bytes_per_device
    tensors = cpu.tensor_map
    # deepseek-tiny: 1 dense layer, 4 MoE layers, fully rematerialised: every layer keeps its input and
    # the backward pass of one layer (the larger block's) holds all of that layer's activations again.
    kept = (
        tensors["activations/decoder/dense_layers/inputs"].bytes_per_device * 1
        + tensors["activations/decoder/moe_layers/inputs"].bytes_per_device * 4
        + max(block_sums.values())
    )
    assert dict(estimated.categories) == {
        "params": by_kind["param"],
        "optimizer_state": by_kind["opt_state"],
        "inputs": by_kind["input"],
        "gradients": by_kind["param"],
        "activations": kept,
    }


def test_without_remat_every_layer_keeps_every_activation():
    cpu = load_golden(GOLDEN / "cpu-8" / "ep-as-cp.json")
    no_remat = dataclasses.replace(cpu, case=dataclasses.replace(cpu.case, overrides=(("model.remat", "none"),)))
    expected = sum(
        tensor.bytes_per_device * (4 if path.startswith("activations/decoder/moe_layers/") else 1)
        for path, tensor in cpu.tensors
        if tensor.kind == "activation"
    )
    assert dict(_estimate(no_remat).memory.categories)["activations"] == expected
    assert expected > dict(_estimate(cpu).memory.categories)["activations"]


def test_layer_inputs_offloaded_to_the_host_leave_the_hbm_need():
    cpu = load_golden(GOLDEN / "cpu-8" / "ep-as-cp.json")

    def activations(custom: str) -> int:
        overrides = (("model.remat", "custom"), ("model.remat_custom", custom))
        plan = dataclasses.replace(cpu, case=dataclasses.replace(cpu.case, overrides=overrides))
        return dict(_estimate(plan).memory.categories)["activations"]

    tensors = cpu.tensor_map
    inputs = (
        tensors["activations/decoder/dense_layers/inputs"].bytes_per_device * 1
        + tensors["activations/decoder/moe_layers/inputs"].bytes_per_device * 4
    )
    kept = dict(_estimate(cpu).memory.categories)["activations"]
    assert activations("decoder_layer_input:device") == kept
    assert activations("query_proj:offload,decoder_layer_input:offload") == kept - inputs


def test_memory_over_capacity_says_by_how_much():
    # An estimate (a CPU compile priced as TPU) against a chip too small for it; a TPU compile's own verdict
    # is that it fits (below).
    tiny = dataclasses.replace(V5P, hbm_bytes=1_000_000)
    memory = _estimate(load_golden(GOLDEN / "cpu-8" / "ep-as-cp.json"), tiny).memory
    assert not memory.exact and not memory.fits and memory.over == memory.total - 1_000_000


def test_step_bounds_and_roofline(v5p_plan):
    estimate = _estimate(v5p_plan, flops=4.59e14, bytes_accessed=2.765e12 * 2)
    assert estimate.compute.flops_seconds == pytest.approx(1.0)
    assert estimate.compute.memory_seconds == pytest.approx(2.0) and estimate.compute.bound == "memory"
    assert estimate.step_no_overlap == pytest.approx(2.0 + estimate.communication)
    assert estimate.step_full_overlap == pytest.approx(2.0)
    assert compute_time(V5P, None, None).seconds == 0


def test_cost_figures_read_the_compilers_dict():
    assert cost_figures({"flops": 2.0, "bytes accessed": 3.0, "optimal_seconds": 1e-6}) == (2.0, 3.0)
    assert cost_figures([{"flops": 2.0}]) == (2.0, None)
    assert cost_figures(None) == (None, None)


def test_efficiency_override_is_recorded(v5p_plan):
    default, half = _estimate(v5p_plan), _estimate(v5p_plan, efficiency=0.5)
    assert (default.efficiency, default.efficiency_source) == (0.82, "hardware table")
    assert (half.efficiency, half.efficiency_source) == (0.5, "caller")
    for a, b in zip(default.rows, half.rows, strict=True):
        assert b.seconds > a.seconds
    with pytest.raises(HardwareError, match="efficiency"):
        _estimate(v5p_plan, efficiency=1.5)


def test_unmatched_and_unknown_trip_rows_are_unpriced(v5p_plan):
    rows = list(v5p_plan.collectives)
    rows[0] = dataclasses.replace(rows[0], axes=None, groups="{{0,5}}")
    rows[1] = dataclasses.replace(rows[1], loop_trips=None)
    estimate = _estimate(dataclasses.replace(v5p_plan, collectives=tuple(rows)))
    assert estimate.unpriced_rows == 2
    assert estimate.rows[0].seconds is None and estimate.rows[0].unpriced == "groups match no mesh axes"
    assert estimate.rows[1].unpriced == "unknown loop trip count"
    assert estimate.communication == pytest.approx(sum(r.seconds for r in estimate.rows[2:]))


def test_multi_slice_gradients_cross_dcn(v5p_plan):
    """Two v5p-16 slices joined over `data`: every parameter is replicated over `data`, so its gradient
    is all-reduced across the slices at the chip's 6.25e9 B/s of DCN: 2 x (1/2 x bytes) / 6.25e9."""
    mesh = (("data", 2), ("stage", 1), ("fsdp", 4), ("expert", 2))
    plan = dataclasses.replace(v5p_plan, case=dataclasses.replace(v5p_plan.case, mesh=mesh, topology="2xv5p-16"))
    estimate = _estimate(plan, slices=2)
    params = sum(t.bytes_per_device for _, t in plan.tensors if t.kind == "param")
    assert [(p.row.op, p.row.axes, p.row.bytes, p.row.source) for p in estimate.cross_slice] == [
        ("all-reduce", ("data",), params, SOURCE)
    ]
    expected = 2 * (1e-5 + (1 / 2) * params / 6.25e9 / 0.82)
    assert estimate.cross_slice[0].time.seconds == pytest.approx(expected)
    assert dict(estimate.by_axes)["data"] == pytest.approx(expected)
    single = _estimate(v5p_plan)
    assert estimate.communication == pytest.approx(single.communication + expected)


def test_fsdp_across_slices_gathers_and_scatters_over_dcn(v5p_plan):
    """With fsdp spanning the two slices (MaxText's dcn_fsdp_parallelism), the parameters sharded over fsdp
    are gathered across slices for the forward pass and their gradients reduce-scattered back; the others'
    gradients are all-reduced; every row is over fsdp."""
    mesh = (("data", 1), ("stage", 1), ("fsdp", 8), ("expert", 2))
    case = dataclasses.replace(v5p_plan.case, mesh=mesh, topology="2xv5p-16", overrides=(("dcn_axis", "fsdp"),))
    plan = dataclasses.replace(v5p_plan, case=case)
    estimate = estimate_plan(plan, V5P, layout_for(V5P, mesh, slices=2, dcn_axis="fsdp"))
    params = [t for _, t in plan.tensors if t.kind == "param"]
    split = sum(t.bytes_per_device for t in params if any("fsdp" in str(entry) for entry in t.spec))
    whole = sum(t.bytes_per_device for t in params) - split
    assert split and whole
    rows = {(p.row.op, p.row.axes, p.row.pass_): p.row.bytes for p in estimate.cross_slice}
    assert rows[("all-gather", ("fsdp",), "forward")] == 2 * split
    assert rows[("reduce-scatter", ("fsdp",), "backward")] == 2 * split
    assert rows[("all-reduce", ("fsdp",), "backward")] == whole
    # Each device exchanges its shard with its peer in the other slice: half the gathered row crosses, at the
    # chip's 6.25e9 B/s of DCN; the all-reduce's buffer is first summed over the 4 fsdp devices of a slice.
    times = {(p.row.op, p.row.pass_): p.time.seconds for p in estimate.cross_slice}
    assert times[("all-gather", "forward")] == pytest.approx(1e-5 + (1 / 2) * 2 * split / 6.25e9 / 0.82)
    assert times[("all-reduce", "backward")] == pytest.approx(2 * (1e-5 + (1 / 2) * whole / 4 / 6.25e9 / 0.82))


def test_a_layout_for_another_mesh_is_refused(v5p_plan):
    with pytest.raises(HardwareError, match="is not the plan's mesh"):
        estimate_plan(v5p_plan, V5P, layout_for(V5P, {"fsdp": 8}))
    with pytest.raises(HardwareError, match="layout is for v6e"):
        estimate_plan(v5p_plan, V5P, layout_for("v6e", v5p_plan.case.mesh))


@pytest.mark.parametrize("golden", ["v5p-16/ep-as-cp.json", "tpu7x-8/ep-as-cp.json", "cpu-8/ep-as-cp.json"])
def test_json_round_trip_is_exact(golden):
    plan = load_golden(GOLDEN / golden)
    hardware = load_hardware("tpu7x" if "tpu7x" in golden else "v5p")
    estimate = _estimate(plan, hardware, flops=1.5e9, bytes_accessed=None)
    text = json.dumps(estimate_to_json(estimate), sort_keys=True, indent=2)
    back = estimate_from_json(json.loads(text))
    assert back == estimate
    assert json.dumps(estimate_to_json(back), sort_keys=True, indent=2) == text


def test_json_of_a_multi_slice_estimate_round_trips(v5p_plan):
    mesh = (("data", 2), ("stage", 1), ("fsdp", 4), ("expert", 2))
    plan = dataclasses.replace(v5p_plan, case=dataclasses.replace(v5p_plan.case, mesh=mesh))
    estimate = _estimate(plan, slices=2)
    assert estimate_from_json(json.loads(json.dumps(estimate_to_json(estimate)))) == estimate


def test_corrupt_estimate_json_is_a_plan_error(v5p_plan):
    data = estimate_to_json(_estimate(v5p_plan))
    del data["memory"]
    with pytest.raises(PlanError, match="corrupt estimate"):
        estimate_from_json(data)


def test_a_step_the_tpu_compiler_placed_fits_even_where_its_static_sum_is_over():
    # The static sum counts buffers alive at different times together (MaxText's deepseek2-16b v5p-8 run logs
    # 100.4 GB against a chip of 95.74 GiB and trains): a compile that succeeded is the verdict.
    from shardscope.plan.estimate import MemoryEstimate
    from shardscope.report.estimate_text import memory_verdict

    placed = MemoryEstimate((("compiler_temp", 100 * 2**30),), 95 * 2**30, EXACT)
    assert placed.fits and placed.over == 0
    estimated = MemoryEstimate((("activations", 100 * 2**30),), 95 * 2**30, ESTIMATED)
    assert not estimated.fits and estimated.over == 5 * 2**30

    class _Shown:
        memory = placed

    assert memory_verdict(_Shown()).startswith("fits: the TPU compiler placed the step")  # type: ignore[arg-type]


def test_a_flop_count_past_two_to_the_53_is_written_as_it_reads_back():
    """A step's FLOPs summed as integers can pass 2**53 (Llama 3.1 405B's fp8 step on tpu7x-512: 7.4e16 per
    device); the plan spells the count as its record (a float) holds it, so writing, reading and writing again
    gives the same bytes."""
    from shardscope.plan.json import plan_from_json, plan_to_json

    plan = load_golden(GOLDEN / "tpu7x-8" / "ep-as-cp.json")
    assert plan.estimate is not None
    exact = 74108382072775172  # not a float: the nearest one is 74108382072775168
    compute = dataclasses.replace(plan.estimate.compute, flops=exact)
    plan = dataclasses.replace(plan, estimate=dataclasses.replace(plan.estimate, compute=compute))
    written = plan_to_json(plan)
    assert '"flops": 74108382072775168' in written
    assert plan_to_json(plan_from_json(written)) == written
