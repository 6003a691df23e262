"""The estimate wherever a plan is shown: the plan JSON, the dump summary, diff (Δ time), the HTML and
Markdown reports. Every expected figure is recomputed from the cost model's own pieces (`estimate_plan` on
a layout built here), never copied from a run."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.cost import estimate_plan, layout_for, load_hardware, price_plan
from shardscope.cost.price import route_of
from shardscope.diff import diff_plans, diff_to_json
from shardscope.plan import load_plan, plan_from_json, plan_to_json
from shardscope.plan.units import human_seconds, signed_seconds
from shardscope.report.html import render_html
from shardscope.report.markdown import render_markdown

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "deepseek-tiny"


def unpriced(path: Path):
    return dataclasses.replace(load_plan(path), estimate=None)


def independent(plan, generation: str, slice_shape=None):
    hardware = load_hardware(generation)
    layout = layout_for(hardware, plan.case.mesh, slice_shape=slice_shape)
    compute = dict(plan.compute)
    return estimate_plan(
        plan,
        hardware,
        layout,
        flops=compute.get("flops"),
        bytes_accessed=compute.get("bytes_accessed"),
        work=plan.work,
        route=route_of(plan.case.topology, hardware.name),
        cpu_program=plan.case.topology.startswith("cpu"),
    )


def test_a_cpu_plan_prices_only_when_a_generation_is_named():
    plan = unpriced(GOLDEN / "cpu-8" / "default.json")
    assert price_plan(plan).estimate is None
    priced = price_plan(plan, "v5p")
    assert priced.estimate == independent(plan, "v5p")
    assert priced.estimate.slice_shape == (2, 2, 2)  # eight v5p devices: the standard 2x2x2 slice
    assert dataclasses.replace(priced, estimate=None) == plan  # pricing adds, never alters


def test_a_tpu_plan_prices_as_its_own_topology():
    plan = unpriced(GOLDEN / "tpu7x-8" / "ep-as-cp.json")
    estimate = price_plan(plan).estimate
    assert estimate.hardware == "tpu7x" and estimate.slice_shape == (2, 2, 1)
    assert estimate == independent(plan, "tpu7x", slice_shape=(2, 2, 1))
    assert estimate.memory.exact  # compiled for this very generation
    # The same plan priced on another generation cannot use the TPU7x compiler's memory figures.
    assert not price_plan(plan, "v5p").estimate.memory.exact


def test_the_estimate_round_trips_through_the_plan_json():
    priced = price_plan(unpriced(GOLDEN / "cpu-8" / "ep-as-cp.json"), "v6e", efficiency=0.5)
    again = plan_from_json(plan_to_json(priced))
    assert again == priced
    assert again.estimate.efficiency == 0.5 and again.estimate.efficiency_source == "caller"
    assert plan_to_json(again) == plan_to_json(priced)


def test_older_plans_without_estimate_or_compute_still_read():
    data = json.loads(plan_to_json(price_plan(unpriced(GOLDEN / "cpu-8" / "default.json"), "v5p")))
    data.pop("estimate")
    data.pop("compute", None)
    plan = plan_from_json(json.dumps(data))
    assert plan.estimate is None and plan.compute == ()


def test_an_estimate_that_does_not_match_its_plan_is_corrupt():
    data = json.loads(plan_to_json(price_plan(unpriced(GOLDEN / "cpu-8" / "default.json"), "v5p")))
    data["estimate"]["rows"].pop()
    with pytest.raises(Exception, match="estimate prices"):
        plan_from_json(json.dumps(data))


def test_diff_prices_both_sides_on_one_target():
    old, new = unpriced(GOLDEN / "cpu-8" / "default.json"), unpriced(GOLDEN / "cpu-8" / "ep-as-cp.json")
    diff = diff_plans(old, new, hardware="v5p")
    assert diff.cost_before == independent(old, "v5p")
    assert diff.cost_after == independent(new, "v5p")
    # Without a named generation, the one a plan was priced on is used for both.
    assert diff_plans(price_plan(old, "v6e"), new).cost_after.hardware == "v6e"
    assert diff_plans(old, new).cost_before is None


def test_a_cpu_plan_diffed_with_a_tpu_plan_prices_as_that_tpu():
    cpu, tpu = unpriced(GOLDEN / "cpu-8" / "ep-as-cp.json"), unpriced(GOLDEN / "tpu7x-8" / "ep-as-cp.json")
    diff = diff_plans(cpu, tpu)
    assert diff.cost_before.hardware == diff.cost_after.hardware == "tpu7x"


def test_estimates_never_decide_the_verdict():
    plan = unpriced(GOLDEN / "cpu-8" / "default.json")
    assert diff_plans(plan, price_plan(plan, "v5p")).same
    assert diff_plans(price_plan(plan, "v4"), price_plan(plan, "v5p", efficiency=0.3)).same


def test_diff_json_carries_both_estimates():
    old, new = unpriced(GOLDEN / "cpu-8" / "default.json"), unpriced(GOLDEN / "cpu-8" / "ep-as-cp.json")
    data = diff_to_json(diff_plans(old, new, hardware="v5p"))
    assert data["cost_after"]["communication"] == pytest.approx(independent(new, "v5p").communication)
    assert data["cost_before"]["by_axes"] == pytest.approx(dict(independent(old, "v5p").by_axes))


def test_the_reports_show_the_change_in_time():
    old, new = unpriced(GOLDEN / "cpu-8" / "default.json"), unpriced(GOLDEN / "cpu-8" / "ep-as-cp.json")
    diff = diff_plans(old, new, hardware="v5p")
    # Both plans know their compiled work, so the headline compares the expected steps.
    assert old.compute and new.compute
    delta = independent(new, "v5p").expected - independent(old, "v5p").expected
    headline = f"{signed_seconds(delta)} per step over default on v5p 2x2x2"
    assert headline in render_markdown(diff)
    page = render_html(diff)
    assert headline in page
    svgs = re.findall(r"<svg\b.*?</svg>", page, flags=re.S)
    assert len(svgs) == 2  # time per mesh axis before/after; HBM against capacity
    for axis, seconds in independent(new, "v5p").by_axes:
        assert f"{axis}: {human_seconds(seconds)}" in svgs[0]
    assert "capacity 95.0 GiB" in svgs[1]
    assert not re.search(r"(src|href)=\"https?:", page)  # nothing fetched from the network


def test_dump_summary_and_json_with_hardware(tmp_path):
    runner = CliRunner()
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["dump", "deepseek-tiny", "--hardware", "v5p", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    assert plan.estimate == independent(dataclasses.replace(plan, estimate=None), "v5p")
    shown = runner.invoke(app, ["dump", "deepseek-tiny", "--hardware", "v5p"], terminal_width=160)
    assert "Estimate on v5p 2x2x2" in shown.output
    assert f"communication {human_seconds(plan.estimate.communication)}" in shown.output
    assert "HBM fits" in shown.output


def test_diff_cli_prints_the_cost_headline(tmp_path):
    runner = CliRunner()
    args = ["diff", str(GOLDEN / "cpu-8" / "default.json"), str(GOLDEN / "cpu-8" / "ep-as-cp.json")]
    result = runner.invoke(app, [*args, "--hardware", "v5p"], terminal_width=200)
    assert result.exit_code == 1
    old, new = unpriced(GOLDEN / "cpu-8" / "default.json"), unpriced(GOLDEN / "cpu-8" / "ep-as-cp.json")
    delta = independent(new, "v5p").expected - independent(old, "v5p").expected
    assert f"{signed_seconds(delta)} per step over default on v5p 2x2x2" in result.output
    assert "Estimated time per step (v5p 2x2x2, efficiency 0.82)" in result.output


def test_tensors_only_plans_compare_no_time(tmp_path):
    runner = CliRunner()
    paths = []
    for preset in ("default", "ep-as-cp"):
        out = tmp_path / f"{preset}.json"
        result = runner.invoke(app, ["dump", "deepseek-tiny", "--preset", preset, "--tensors-only", "-o", str(out)])
        assert result.exit_code == 0, result.output
        paths.append(str(out))
    result = runner.invoke(app, ["diff", *paths, "--hardware", "v5p"], terminal_width=200)
    assert "communication unknown: nothing compiled" in result.output
    assert "per step over" not in result.output  # no "±0 per step" from two plans with no time at all
    assert "traffic unknown: nothing compiled" in result.output and "0 B → 0 B" not in result.output
    assert result.exit_code == 1  # their tensors' specs differ
