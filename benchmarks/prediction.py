"""The prediction (no compile) against the compiler: `python benchmarks/prediction.py [SECTION ...]`.

Sections (all by default):
  goldens   For every golden case with collectives, the tensors-only plan (the golden without what the
            compile added) is given to `shardscope.predict`; per case and mesh-axis set, the compiled and
            predicted traffic per device per step and the error, the share of compiled traffic whose causes
            the prediction names, and how many predicted forward weight all-gathers match a compiled one.
  runs      The stored real-size plans of MaxText's published runs (benchmarks/plans: CPU and TPU compiles):
            each plan's expected step and communication, priced as compiled and as predicted from its tensors
            alone, and the error.
  sweep     A search compiled in full (`advise` compiling every candidate screening passes; compiles are
            cached, so a second run takes seconds): predicted vs compiled expected step per candidate, their
            Spearman rank correlation, and whether the compiled best is in the predicted top 3.
            SWEEP=model:topology[:preset,preset] picks it (default deepseek2-16b:cpu-16:ep-as-cp,ep-tp,pure-fsdp
            on v5p: 43 candidates; without presets every built-in one is searched, hundreds of compiles).
  fit       The prediction's two HBM constants (`shardscope.predict.work`: passes over each recorded
            activation, passes over a dropless MoE's dispatch slots) on a grid, each pair's error against
            the compiled expected step of the fitting runs' stored plans (`fitting_set.yaml`, both routes:
            the cost model's rule), the constants in use and the grid's best marked. Only `fit`'s grid is
            in-sample; `runs` beyond the fitting set and `sweep` are plans the fit never saw.
Prints numbers; asserts nothing.
"""

from __future__ import annotations

import itertools
import os
import re
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from shardscope.advise.rank import compiled_candidates
from shardscope.advise.sweep import advise, make_request
from shardscope.cost.price import price_plan
from shardscope.golden.cases import DEFAULT_GOLDEN_DIR, load_manifest
from shardscope.golden.store import golden_path, load_golden
from shardscope.plan.document import Plan
from shardscope.plan.json import plan_from_json
from shardscope.plan.records import is_routed_expert
from shardscope.predict import predicted_plan, work
from shardscope.predict.layout import resolved
from shardscope.predict.measure import axes_errors, covered_share, gather_matches, tensors_only

PLANS = Path(__file__).resolve().parent / "plans"
DEFAULT_SWEEP = "deepseek2-16b:cpu-16:ep-as-cp,ep-tp,pure-fsdp"
_GENERATION = re.compile(r"_(?:\d+x)?(v5p|v6e|tpu7x)-")


def _kib(count: int) -> str:
    return f"{count / 1024:,.0f}"


def goldens(root: Path = DEFAULT_GOLDEN_DIR) -> None:
    """Per golden case and axes: compiled vs predicted traffic; a summary of the absolute per-axis errors."""
    errors: list[float] = []
    print(f"{'case':42} {'axes':28} {'compiled KiB':>13} {'predicted KiB':>14} {'error':>8}")
    for case in load_manifest(root):
        path = golden_path(root, case)
        if not path.exists():
            continue
        golden = load_golden(path)
        if not golden.collectives:
            continue
        predicted = predicted_plan(tensors_only(golden))
        label = f"{case.model}/{case.topology}/{case.stem}"
        for row in axes_errors(golden, predicted):
            error = "—" if row.error is None else f"{row.error:+.1%}"
            if row.error is not None:
                errors.append(abs(row.error))
            print(f"{label:42} {'+'.join(row.axes):28} {_kib(row.compiled):>13} {_kib(row.predicted):>14} {error:>8}")
        matched, total = gather_matches(golden, predicted)
        print(
            f"{label:42} covered {covered_share(golden, predicted):.0%} of compiled traffic; "
            f"forward weight all-gathers matched {matched}/{total}"
        )
    if errors:
        print(
            f"per-axis |error| over {len(errors)} (case, axes) pairs: median {statistics.median(errors):.1%}, "
            f"worst {max(errors):.1%}"
        )


def _family(stem: str, plan: Plan) -> str:
    """pipeline (seed 003's), unresolved (a case that does not resolve here: a `maxtext:` model without
    MaxText, predicted without its routing, attention kernel and remat policy), moe (routed experts) or
    dense."""
    if "seed003" in stem:
        return "pipeline"
    if resolved(plan) is None:
        return "unresolved"
    return "moe" if any(is_routed_expert(path, record) for path, record in plan.tensors) else "dense"


def _stored_plans() -> list[tuple[str, str, Plan, float]]:
    """(name, TPU generation, tensors-only plan, compiled expected step) of every stored run plan."""
    found = []
    for path in sorted(PLANS.glob("*.json")):
        if path.name.endswith(".gpu.json"):
            continue  # a GPU cluster's plan prices on its own GPU only, not as a TPU generation
        plan = plan_from_json(path.read_text(), path.name)
        generation = match.group(1) if (match := _GENERATION.search(path.stem)) else "v5p"
        compiled = price_plan(plan, generation).estimate
        if compiled is not None and compiled.expected:
            found.append((path.stem, generation, tensors_only(plan), compiled.expected))
    return found


GRID = tuple(itertools.product((0.8, 1.0, 1.2, 1.4, 1.6, 2.0), (4, 6, 8, 10, 12, 16)))


def _fitting_plans() -> list[tuple[str, str, Plan, float]]:
    """The stored plans of the runs `fitting_set.yaml` names (both routes), dense and MoE: the only plans the
    prediction's constants may be fitted to, as the cost model's are."""
    from published_runs import fitting_ids

    fitting = fitting_ids()
    return [
        entry
        for entry in _stored_plans()
        if entry[0].rsplit(".", 1)[0] in fitting and _family(entry[0], entry[2]) in ("dense", "moe")
    ]


def fit_grid() -> list[tuple[tuple[float, int], dict[str, list[float]]]]:
    """Each (activation passes, dispatch passes) of the grid with its errors per family against the fitting
    runs' compiles."""
    stored = _fitting_plans()
    chosen = (work._ELEMENTWISE_PASSES, work._DISPATCH_PASSES)
    found = []
    try:
        for elementwise, dispatch in GRID:
            work._ELEMENTWISE_PASSES, work._DISPATCH_PASSES = elementwise, dispatch
            errors: dict[str, list[float]] = {"dense": [], "moe": []}
            for stem, generation, tensors, compiled in stored:
                predicted = price_plan(predicted_plan(tensors), generation).estimate
                if predicted is not None and predicted.expected is not None:
                    errors[_family(stem, tensors)].append(predicted.expected / compiled - 1)
            found.append(((elementwise, dispatch), errors))
    finally:
        work._ELEMENTWISE_PASSES, work._DISPATCH_PASSES = chosen
    return found


def best_pair(grid: list[tuple[tuple[float, int], dict[str, list[float]]]]) -> tuple[float, int]:
    """The grid point of least mean |error| over every fitting plan (ties: the first in grid order)."""
    return min(grid, key=lambda point: statistics.mean(abs(e) for errs in point[1].values() for e in errs))[0]


def fit() -> None:
    """The grid of (activation passes, dispatch passes): mean |error| per family against the fitting runs'
    compiles, the constants in use and the grid's best marked."""
    grid = fit_grid()
    chosen, best = (work._ELEMENTWISE_PASSES, work._DISPATCH_PASSES), best_pair(grid)
    count = sum(len(errs) for errs in grid[0][1].values())
    print(f"\n{'activation passes':>17} {'dispatch passes':>15}   mean |error| (worst) over {count} fitting plans")
    for pair, errors in grid:
        summary = "   ".join(
            f"{family} {statistics.mean(map(abs, found)):.1%} ({max(found, key=abs):+.1%})"
            for family, found in errors.items()
            if found
        )
        marks = [m for m, on in (("in use", pair == chosen), ("best", pair == best)) if on]
        print(f"{pair[0]:>17} {pair[1]:>15}   {summary}{'  <- ' + ', '.join(marks) if marks else ''}")


def runs() -> None:
    """Every stored published-run plan: expected step and communication, compiled vs predicted."""
    print(f"\n{'published run plan':44} {'compiled':>10} {'predicted':>10} {'error':>7}   comm: compiled / predicted")
    errors: dict[str, list[float]] = {"dense": [], "moe": [], "pipeline": [], "unresolved": []}
    for path in sorted(PLANS.glob("*.json")):
        if path.name.endswith(".gpu.json"):
            continue  # a GPU cluster's plan prices on its own GPU only, not as a TPU generation
        plan = plan_from_json(path.read_text(), path.name)
        found = _GENERATION.search(path.stem)
        generation = found.group(1) if found else "v5p"
        compiled = price_plan(plan, generation).estimate
        started = time.perf_counter()
        predicted = price_plan(predicted_plan(tensors_only(plan)), generation).estimate
        took = time.perf_counter() - started
        if compiled is None or predicted is None or not compiled.expected or predicted.expected is None:
            continue
        error = predicted.expected / compiled.expected - 1
        family = _family(path.stem, plan)
        errors[family].append(abs(error))
        print(
            f"{path.stem:44} {compiled.expected:9.3f}s {predicted.expected:9.3f}s {error:+7.1%}   "
            f"{compiled.communication:.3f} / {predicted.communication:.3f} s  ({took * 1e3:.0f} ms)"
        )
    for family, found in errors.items():
        if found:
            print(
                f"{family}: mean |error| {statistics.mean(found):.1%} over {len(found)} plans, worst {max(found):.1%}"
            )


def sweep(spec: str) -> None:
    """A whole search compiled: predicted vs compiled expected step, rank correlation, top-3 hit."""
    model, topology, *rest = spec.split(":")
    presets = rest[0].split(",") if rest and rest[0] else None
    hardware = None if topology.startswith(("v", "tpu")) else "v5p"
    request = make_request(model, topology, presets, None, None, hardware, None)
    started = time.perf_counter()
    advice = advise(request, jobs=int(os.environ.get("JOBS", "2")))
    print(
        f"\nsweep {model} on {topology} ({'all presets' if presets is None else ', '.join(presets)}): "
        f"{advice.enumerated} candidates, {advice.predicted} predicted in {advice.predict_seconds:.1f} s, "
        f"{advice.compiled} compiled + {advice.cached} cached in {time.perf_counter() - started:.0f} s"
    )
    rows = [
        (e.candidate.key, e.step_expected, e.predicted_step, e.fits)
        for e in compiled_candidates(advice)
        if e.predicted_step is not None
    ]
    table = pd.DataFrame(rows, columns=["candidate", "compiled", "predicted", "fits"])
    if len(table) < 2:
        print("fewer than two compiled candidates with a prediction")
        return
    table["error"] = table["predicted"] / table["compiled"] - 1
    rho = table["compiled"].rank().corr(table["predicted"].rank())
    fitting = table[table["fits"]]
    best = fitting.sort_values("compiled").iloc[0]["candidate"] if len(fitting) else None
    top3 = list(fitting.sort_values("predicted")["candidate"][:3])
    with pd.option_context("display.width", 160, "display.max_rows", 400):
        print(table.sort_values("compiled").to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(
        f"Spearman rank correlation over {len(table)} compiled candidates: {rho:.3f}; "
        f"|error| median {table['error'].abs().median():.1%}, worst {table['error'].abs().max():.1%}; "
        f"compiled best {best} {'is' if best in top3 else 'is NOT'} in the predicted top 3"
    )


def main(sections: list[str]) -> None:
    chosen = sections or ["goldens", "runs", "fit", "sweep"]
    if "goldens" in chosen:
        goldens()
    if "runs" in chosen:
        runs()
    if "fit" in chosen:
        fit()
    if "sweep" in chosen:
        sweep(os.environ.get("SWEEP", DEFAULT_SWEEP))


if __name__ == "__main__":
    main(sys.argv[1:])
