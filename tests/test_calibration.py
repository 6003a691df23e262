"""The cost model's calibration: fitted on the declared fitting set alone, current with the stored plans, and
the published-runs page and the README's summary generated from them."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from shardscope.case.hardware import load_hardware
from shardscope.cost.step import expected_step, per_op_compute
from shardscope.hlo.profile import KINDS, WorkBin
from shardscope.plan.estimate import RowTime
from shardscope.plan.records import CollectiveRow

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@contextlib.contextmanager
def benchmark_script(name: str):
    """One of benchmarks/'s scripts, imported as they import each other, and forgotten afterwards."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def bench():
    """calibrate.py and published_runs.py, imported as the scripts import each other."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        calibrate = importlib.import_module("calibrate")
        published_runs = importlib.import_module("published_runs")
        yield calibrate, published_runs
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in ("calibrate", "published_runs", "program_counts"):
            sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def fitted(bench):
    """The fit of the fitting runs and each one's fit without it (computed once: about half a minute)."""
    calibrate, published_runs = bench
    runs = calibrate.fitting_runs(published_runs.catalogue())
    return runs, calibrate.fit(runs), calibrate.leave_one_out(runs)


def test_the_fitting_set_names_catalogue_runs_once_and_the_table_marks_exactly_them(bench):
    _, published_runs = bench
    named = yaml.safe_load(published_runs.FITTING_SET.read_text())["runs"]
    assert len(named) == len(set(named))
    ids = {run["id"] for run in published_runs.catalogue()}
    assert set(named) <= ids
    for row in published_runs.rows():
        assert row.fitted == (row.run["id"] in named)
    assert set(named) != ids  # some runs validate


def test_validation_runs_reach_no_constant(bench, monkeypatch):
    """With every run outside the fitting set taken out of the catalogue, the calibration does not move."""
    calibrate, published_runs = bench
    full = calibrate.fit(calibrate.fitting_runs(published_runs.catalogue()))
    named = published_runs.fitting_ids()
    only_fitting = [run for run in published_runs.catalogue() if run["id"] in named]
    monkeypatch.setattr(published_runs, "catalogue", lambda: only_fitting)
    for cached in (calibrate._cases, calibrate._compile_pair, published_runs.fitting_ids):
        cached.cache_clear()
    try:
        assert calibrate.fit(calibrate.fitting_runs(published_runs.catalogue())) == full
    finally:
        for cached in (calibrate._cases, calibrate._compile_pair, published_runs.fitting_ids):
            cached.cache_clear()


@pytest.mark.slow
def test_hardware_table_and_the_calibration_record_are_what_the_plans_give(bench, fitted):
    calibrate, _ = bench
    runs, at, loo = fitted
    assert calibrate.table_constants() == {k: round(v, 2) for k, v in at.constants().items()}
    assert calibrate.RECORD.read_text() == calibrate.record(runs, at, loo)


@pytest.mark.slow
def test_the_published_runs_page_and_the_readme_summary_are_generated_from_the_stored_plans(bench, fitted):
    calibrate, published_runs = bench
    runs, at, loo = fitted
    left_out = {(e.run, e.route): e.left_out for e in calibrate.errors(runs, at, loo)}
    for path, text in published_runs.generated(published_runs.rows(), left_out).items():
        assert published_runs.PAGE_START in text or path != published_runs.PAGE
        assert path.read_text() == text, f"{path.name} is stale: run python benchmarks/published_runs.py --write"


def test_the_pipeline_passes_are_counted_from_the_program_as_no_fitting_run_pipelines(bench):
    """The prediction's pipeline passes could be fitted only to a pipelined run's measured step: the fitting
    set has none (seed 003's four pipelined runs validate), so they are counted, and the record says so."""
    calibrate, published_runs = bench
    counts = importlib.import_module("program_counts")
    runs = calibrate.fitting_runs(published_runs.catalogue())
    assert counts.pipelined(runs) == []
    seed = [run for run in published_runs.catalogue() if run["id"].startswith("seed003-")]
    assert len(counts.pipelined(seed)) == len(seed) == 4
    assert not any(published_runs.fits_constants(run) for run in seed)
    section = "\n".join(counts.section(runs))
    assert "no pipelined run" in section
    from shardscope.predict.pipeline_work import counts as pass_counts

    assert [c.value for c in pass_counts()] == [3, 1.5, 4]
    assert all(f"| `{c.name}` | {c.value:g} |" in calibrate.RECORD.read_text() for c in pass_counts())


@pytest.mark.slow
def test_the_predictions_hbm_passes_are_the_best_fit_to_the_fitting_runs_alone(bench):
    """The prediction's two fitted constants obey the cost model's rule: the grid's best against the compiled
    steps of the fitting runs' plans, no validation run among them."""
    _, published_runs = bench
    from shardscope.predict import work

    with benchmark_script("prediction") as prediction:
        plans = prediction._fitting_plans()
        assert plans and all(stem.rsplit(".", 1)[0] in published_runs.fitting_ids() for stem, *_ in plans)
        assert prediction.best_pair(prediction.fit_grid()) == (work._ELEMENTWISE_PASSES, work._DISPATCH_PASSES)


def test_check_fails_when_the_table_differs_from_the_fit(bench, monkeypatch, capsys):
    calibrate, _ = bench
    real = calibrate.table_constants()
    monkeypatch.setattr(calibrate, "table_constants", lambda: {**real, "hbm_efficiency": 0.99})
    assert calibrate.main(["--check"]) == 1
    assert "hbm_efficiency: hardware.yaml has 0.99" in capsys.readouterr().err


def test_the_descent_ends_at_the_grid_minimum(bench):
    """Of a smooth bowl whose axes are not the grid's (the losses it minimises couple their constants)."""
    calibrate, _ = bench
    point = calibrate.descend(
        lambda p: (p[0] - 0.372) ** 2 + (p[1] - 0.813) ** 2 + 0.3 * p[0] * p[1], [(0.05, 1.0)] * 2
    )
    grid = [round(0.01 * i, 2) for i in range(5, 101)]
    best = min(
        ((x, y) for x in grid for y in grid),
        key=lambda p: (p[0] - 0.372) ** 2 + (p[1] - 0.813) ** 2 + 0.3 * p[0] * p[1],
    )
    assert point == best


def test_no_generation_fits_its_matmuls_above_the_ceiling(bench, fitted):
    calibrate, _ = bench
    _, at, _ = fitted
    assert all(v <= calibrate.MATMUL_CEILING for k, v in at.constants().items() if "mxu" in k)


_bins = st.builds(
    WorkBin,
    kind=st.sampled_from(KINDS),
    pass_=st.sampled_from(("forward", "backward", "optimizer")),
    executions=st.sampled_from((1, 4, 32)),
    intensity=st.none(),
    ops=st.integers(1, 5),
    flops=st.integers(0, 10**15),
    bytes=st.integers(0, 10**12),
    region=st.sampled_from((None, 1, 4, 32)),
)
_rows = st.tuples(
    st.builds(
        CollectiveRow,
        op=st.just("all-reduce"),
        axes=st.just(("fsdp",)),
        dtype=st.just("bf16"),
        shape=st.just((1024,)),
        bytes=st.integers(1, 10**10),
        count=st.just(1),
        loop_trips=st.sampled_from((None, 1, 4, 32)),
        pass_=st.just("backward"),
        source=st.just(""),
        handoff=st.booleans(),
    ),
    st.builds(RowTime, seconds=st.floats(0, 10), latency=st.just(0.0), transfer=st.just(0.0)),
)


@settings(max_examples=200, deadline=None)
@given(work=st.lists(_bins, max_size=12), rows=st.lists(_rows, max_size=6), cpu=st.booleans())
def test_the_expected_step_lies_between_its_bounds(work, rows, cpu):
    """Every region's max(compute, transfers) plus its hand-offs: never below communication hidden entirely,
    never above no overlap at all."""
    hardware = dataclasses.replace(load_hardware("v5p"), grouped_reference_width=14336.0, grouped_width_exponent=0.3)
    compute = per_op_compute(work, hardware, cpu, expert_width=2048)
    transfers = sum(time.seconds for _, time in rows) + sum(
        entry.bytes / hardware.host_bandwidth_per_device for entry in work if entry.kind == "host"
    )
    value = expected_step(work, rows, hardware, cpu, expert_width=2048)
    assert max(compute, transfers) * (1 - 1e-9) <= value <= (compute + transfers) * (1 + 1e-9)


def test_the_advise_study_page_is_generated_from_its_stored_plans():
    """docs/concepts/advise-study.md holds advise_study.py's comparison of the stored compiled plans."""
    with benchmark_script("advise_study") as study:
        assert study.main(["--check"]) == 0, "run python benchmarks/advise_study.py --write"
        assert "Rank correlation" in study.PAGE.read_text()


def test_the_maxtext_and_reference_comparison_on_the_validation_page_is_generated(bench):
    """The page's side-by-side of MaxText's own program and the reference model (tensors, traffic per axis,
    HBM need, expected step) is what the stored plans give, and each run apart by over 5% says why."""
    with benchmark_script("maxtext_vs_reference") as side_by_side:
        block = side_by_side.page_block()
        assert block.count("reference tensors identical") == len(side_by_side.RUNS)
        assert "not yet explained" not in block
        assert side_by_side.main(["--check"]) == 0


def test_a_priced_plan_holds_its_expected_step_between_its_bounds_with_host_transfers():
    """A step whose host offload transfers outlast its compute (MaxText's `offload` remat policy on a slow host
    link): the estimate's own bounds count them, as its expected step does."""
    import shardscope
    from shardscope.cost.price import price_plan
    from shardscope.hlo.profile import WorkKind

    plan = shardscope.load_plan(BENCHMARKS / "plans" / "llama3.1-8b_v6e-8_tr014.tpu.json")
    offload = WorkBin(WorkKind.HOST, "forward", 32, None, 1, 0, 10**13, 32)
    for work in (plan.work, (*plan.work, offload)):
        estimate = price_plan(dataclasses.replace(plan, work=work), None).estimate
        assert estimate is not None and estimate.expected is not None
        assert estimate.step_full_overlap * (1 - 1e-9) <= estimate.expected <= estimate.step_no_overlap * (1 + 1e-9)
    assert estimate.host_transfer > estimate.compute.seconds  # the case the bounds missed
