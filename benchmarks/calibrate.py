"""Derives the cost model's fitted constants (`calibration` in shardscope/case/hardware.yaml) from the runs
`fitting_set.yaml` names, and from nothing else, using the plans `published_runs.py --plan` stored.

What is fitted, and to what:
- `cpu_memory_bytes_factor`, `cpu_gather_bytes_factor`: a fit to compiles, not to measurements. On every
  fitting run planned on both routes, the TPU compile's bytes of ops without matrix work against the CPU
  compile's elementwise bytes × the one, plus its gathers' and scatters' × the other, plus its `buffer`
  bytes as counted (least squared log error).
- the prediction's pipeline passes are counted from the program, not fitted: the fitting set has no
  pipelined run (`program_counts.py`; CALIBRATION.md's last section says so, as the plans give it).
- `hbm_efficiency`, `kernel_efficiency` (one each for every generation) and `mxu_efficiency` (each
  generation with `MIN_RUNS` fitting runs or more has its own; the shared one, fitted over every fitting
  run, prices the others): the least mean squared log error of the expected step against the measured one,
  over every stored plan of a fitting run (a run planned on both routes counts twice), each plan priced as
  its route prices it.

How: a descent over a grid of fractions in steps of 0.01 (first 0.05), from the middle of the range, to the
neighbour that lowers the loss most until none does. Deterministic, and about a second per fit, so that
every fitting run can be left out and refitted (`--loo`): its error then is an out-of-sample one.

A matmul fraction above `MATMUL_CEILING` of peak is not credible for a whole step's matmuls (the compiler's
own layouts, padding and short contractions cost more than that) without a public measurement saying so;
the search stops there, and a constant at the ceiling is reported as such.

  python benchmarks/calibrate.py           # the fit, each fitting run's error, the record
  python benchmarks/calibrate.py --loo     # and every fitting run left out and predicted
  python benchmarks/calibrate.py --write   # rewrite hardware.yaml's constants and CALIBRATION.md
  python benchmarks/calibrate.py --check   # exit 1 when either differs from what the plans give
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import program_counts
import published_runs

import shardscope
from shardscope.atomic import write_atomic
from shardscope.case.hardware import Hardware, load_hardware
from shardscope.cost.estimate import expert_width
from shardscope.cost.price import price_plan
from shardscope.cost.step import expected_step
from shardscope.hlo.profile import WorkBin
from shardscope.plan.estimate import RowTime
from shardscope.plan.records import CollectiveRow

ROOT = Path(__file__).resolve().parent
HARDWARE_TABLE = ROOT.parent / "shardscope" / "case" / "hardware.yaml"
RECORD = ROOT / "CALIBRATION.md"
# Fitting runs a generation needs for a matmul fraction of its own (fewer would chase each run). Fractions per
# generation were chosen over one shared fraction because they give the lower leave-one-out error on the
# fitting set (`--min-runs 99` fits the shared one alone, for the comparison).
MIN_RUNS = 3
MATMUL_CEILING = 0.80  # the highest whole-step matmul fraction the search allows (see the module doc)
FRACTIONS = (0.05, 1.0)
FACTORS = (0.05, 4.0)
STEP_CONSTANTS = ("hbm_efficiency", "kernel_efficiency")


@dataclass(frozen=True)
class Case:
    """One stored plan of a fitting run, priced apart from the constants being fitted."""

    run: str
    route: str
    measured: float
    work: tuple[WorkBin, ...]
    pairs: tuple[tuple[CollectiveRow, RowTime], ...]
    hardware: Hardware
    width: int


@dataclass(frozen=True)
class CompilePair:
    """A fitting run compiled on both routes: the TPU's bytes of ops without matrix work, and the CPU's by kind."""

    run: str
    tpu: int
    memory: int
    gather: int
    buffer: int


@dataclass(frozen=True)
class Fit:
    """The fitted constants: the CPU route's two byte factors, HBM's and the kernel's fractions, the shared
    matmul fraction and each generation's own."""

    memory_factor: float
    gather_factor: float
    hbm: float
    kernel: float
    shared_mxu: float
    own_mxu: tuple[tuple[str, float], ...]

    def mxu(self, generation: str) -> float:
        return dict(self.own_mxu).get(generation, self.shared_mxu)

    def constants(self) -> dict[str, float]:
        """Every constant by its name in hardware.yaml (`generations.<name>.mxu_efficiency` for a generation's)."""
        out = {
            "mxu_efficiency": self.shared_mxu,
            "hbm_efficiency": self.hbm,
            "kernel_efficiency": self.kernel,
            "cpu_memory_bytes_factor": self.memory_factor,
            "cpu_gather_bytes_factor": self.gather_factor,
        }
        out.update({f"generations.{g}.mxu_efficiency": v for g, v in self.own_mxu})
        return out


def fitting_runs(catalogue: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The catalogue's runs that the fitting set names, plannable and with a measured step."""
    return [
        run
        for run in catalogue
        if published_runs.fits_constants(run)
        and published_runs.plannable(run) is None
        and published_runs.measured_step(run)[0] is not None
    ]


def generation_of(run: dict[str, Any]) -> str:
    return str(run["topology"]).rsplit("-", 1)[0]


def compile_pairs(runs: Iterable[dict[str, Any]]) -> list[CompilePair]:
    return [pair for run in runs if (pair := _compile_pair(run["id"])) is not None]


def cases_of(runs: Iterable[dict[str, Any]]) -> list[Case]:
    return [case for run in runs for case in _cases(run["id"])]


def _run(run_id: str) -> dict[str, Any]:
    return next(run for run in published_runs.catalogue() if run["id"] == run_id)


# A run's plans are read and their collectives priced once per process: every refit reuses them.
@functools.cache
def _compile_pair(run_id: str) -> CompilePair | None:
    run = _run(run_id)
    tpu, cpu = published_runs.plan_path(run, "tpu"), published_runs.plan_path(run, "cpu")
    if not (tpu.exists() and cpu.exists()):
        return None
    tpu_plan, cpu_plan = shardscope.load_plan(tpu), shardscope.load_plan(cpu)
    tpu_bytes = sum(w.bytes for w in tpu_plan.work if w.kind in ("memory", "gather", "buffer"))
    by_kind = {k: sum(w.bytes for w in cpu_plan.work if w.kind == k) for k in ("memory", "gather", "buffer")}
    return CompilePair(run_id, tpu_bytes, by_kind["memory"], by_kind["gather"], by_kind["buffer"])


@functools.cache
def _cases(run_id: str) -> tuple[Case, ...]:
    run = _run(run_id)
    measured, _ = published_runs.measured_step(run)
    assert measured is not None  # fitting_runs keeps measured runs only
    cases = []
    for route in published_runs.ROUTES:
        path = published_runs.plan_path(run, route)
        if not path.exists():
            continue
        plan = shardscope.load_plan(path)
        # The collectives' times do not depend on the fitted constants: priced once, with the table's.
        estimate = price_plan(plan, None if route == "tpu" else generation_of(run)).estimate
        assert estimate is not None
        pairs = (
            *zip(plan.collectives, estimate.rows, strict=True),
            *((p.row, p.time) for p in estimate.cross_slice),
        )
        hardware = load_hardware(generation_of(run))
        cases.append(Case(run_id, route, measured, plan.work, pairs, hardware, expert_width(plan)))
    return tuple(cases)


def descend(
    objective: Callable[[tuple[float, ...]], float], bounds: Sequence[tuple[float, float]]
) -> tuple[float, ...]:
    """The grid point (steps of 0.01) the descent from the middle of `bounds` ends at: each move goes to the
    neighbour (one coordinate one step up or down) with the least objective, first in steps of 0.05, then of
    0.01, until no neighbour is lower. Ties go to the smaller point, so the result is deterministic."""
    point = tuple(round((lo + hi) / 2, 2) for lo, hi in bounds)
    for step in (0.05, 0.01):
        value = objective(point)
        while True:
            neighbours = []
            for i, (lo, hi) in enumerate(bounds):
                for move in (-step, step):
                    moved = round(point[i] + move, 2)
                    if lo <= moved <= hi:
                        neighbours.append((*point[:i], moved, *point[i + 1 :]))
            scored = sorted((objective(n), n) for n in neighbours)
            if not scored or scored[0][0] >= value:
                break
            value, point = scored[0]
    return point


def fit_factors(pairs: Sequence[CompilePair]) -> tuple[float, float]:
    """(memory factor, gather factor) of the least squared log error of the TPU's bytes. A factor no pair has
    bytes for (no gathers among the pairs) is not determined: it stays 1, the bytes as the CPU counts them."""

    def loss(point: tuple[float, float]) -> float:
        memory, gather = point
        return sum(math.log((memory * p.memory + gather * p.gather + p.buffer) / p.tpu) ** 2 for p in pairs)

    if not pairs:
        return 1.0, 1.0
    if not any(p.gather for p in pairs):
        (memory,) = descend(lambda point: loss((point[0], 1.0)), [FACTORS])
        return memory, 1.0
    memory, gather = descend(loss, [FACTORS, FACTORS])
    return memory, gather


def expected(case: Case, memory: float, gather: float, hbm: float, kernel: float, mxu: float) -> float:
    tuned = dataclasses.replace(
        case.hardware,
        mxu_efficiency=mxu,
        hbm_efficiency=hbm,
        kernel_efficiency=kernel,
        cpu_memory_bytes_factor=memory,
        cpu_gather_bytes_factor=gather,
    )
    return expected_step(case.work, case.pairs, tuned, case.route == "cpu", case.width)


def fit(runs: Sequence[dict[str, Any]], min_runs: int = MIN_RUNS) -> Fit:
    """Every fitted constant from these runs alone (see the module doc)."""
    memory, gather = fit_factors(compile_pairs(runs))
    cases = cases_of(runs)
    generations = sorted({c.hardware.name for c in cases})
    own = [g for g in generations if len({c.run for c in cases if c.hardware.name == g}) >= min_runs]

    @functools.cache  # the descent comes back to points it has scored
    def loss(point: tuple[float, ...]) -> float:
        hbm, kernel, shared, *mine = point
        mxu = dict(zip(own, mine, strict=True))
        total = sum(
            math.log(expected(c, memory, gather, hbm, kernel, mxu.get(c.hardware.name, shared)) / c.measured) ** 2
            for c in cases
        )
        return total / len(cases)

    matmul = (FRACTIONS[0], MATMUL_CEILING)
    hbm, kernel, shared, *mine = descend(loss, [FRACTIONS, FRACTIONS, matmul, *([matmul] * len(own))])
    if len(own) == len(generations):
        # Every generation fitted has its own: the shared fraction, which prices generations without fitting
        # runs, is then fitted over every run at the other constants' values.
        (shared,) = descend(lambda p: loss((hbm, kernel, p[0], *[p[0]] * len(own))), [matmul])
    return Fit(memory, gather, hbm, kernel, shared, tuple(zip(own, mine, strict=True)))


@dataclass(frozen=True)
class RunError:
    run: str
    route: str
    in_sample: float  # expected / measured - 1 at the fit of every fitting run
    left_out: float | None  # ... at the fit without this run (None: not computed)


def errors(runs: Sequence[dict[str, Any]], at: Fit, loo: dict[str, Fit] | None = None) -> list[RunError]:
    out = []
    for case in cases_of(runs):

        def error(f: Fit, case: Case = case) -> float:
            generation = case.hardware.name
            value = expected(case, f.memory_factor, f.gather_factor, f.hbm, f.kernel, f.mxu(generation))
            return value / case.measured - 1

        out.append(RunError(case.run, case.route, error(at), None if loo is None else error(loo[case.run])))
    return out


def leave_one_out(runs: Sequence[dict[str, Any]], min_runs: int = MIN_RUNS) -> dict[str, Fit]:
    """Each fitting run's fit without it."""
    return {run["id"]: fit([r for r in runs if r is not run], min_runs) for run in runs}


def mape(values: Iterable[float]) -> float:
    values = list(values)
    return 100 * sum(abs(v) for v in values) / len(values) if values else float("nan")


def record(runs: Sequence[dict[str, Any]], at: Fit, loo: dict[str, Fit]) -> str:
    """CALIBRATION.md: each constant with its value, the runs that fit it, the fit's residual and its spread
    over the leave-one-out refits; then each fitting run's error in sample and left out."""
    found = errors(runs, at, loo)
    by_generation: dict[str, list[str]] = {}
    for run in runs:
        by_generation.setdefault(generation_of(run), []).append(run["id"])
    pairs = [p.run for p in compile_pairs(runs)]

    def residual(route_runs: set[str] | None) -> str:
        chosen = [e.in_sample for e in found if route_runs is None or e.run in route_runs]
        return f"{math.sqrt(statistics.fmean(math.log1p(v) ** 2 for v in chosen)):.3f}" if chosen else "–"

    lines = [
        "# The cost model's fitted constants",
        "",
        "Generated by `python benchmarks/calibrate.py --write` from the plans in `benchmarks/plans/` of the runs",
        "`benchmarks/fitting_set.yaml` names, and from no other run. `python benchmarks/calibrate.py --check` fails",
        "when this page or `shardscope/case/hardware.yaml` differs from what the plans give.",
        "",
        "Residual: the root mean squared log error of the fitted runs' expected steps against their measured ones",
        "(every stored plan, both routes). Leave-one-out: the constant's lowest and highest value over the refits",
        "that each leave one fitting run out.",
        "",
        "| constant | value | fitted on | residual | leave-one-out |",
        "|---|---|---|---|---|",
    ]
    constants = at.constants()
    for name, value in constants.items():
        spread = [f.constants().get(name) for f in loo.values()]
        known = [v for v in spread if v is not None]
        span = f"{min(known):.2f} – {max(known):.2f}" if known else "–"
        if name.startswith("cpu_"):
            fitted_on, rms = f"compiles of {len(pairs)} runs on both routes", "–"
        elif name.startswith("generations."):
            generation = name.split(".")[1]
            fitted_on, rms = (
                f"{len(by_generation[generation])} {generation} runs",
                residual(set(by_generation[generation])),
            )
        else:
            fitted_on, rms = f"{len(runs)} runs", residual(None)
        ceiling = " (the ceiling)" if "mxu" in name and value >= MATMUL_CEILING else ""
        lines.append(f"| `{name}` | {value:.2f}{ceiling} | {fitted_on} | {rms} | {span} |")
    tpu = [e for e in found if e.route == "tpu"]
    cpu = [e for e in found if e.route == "cpu"]
    lines += [
        "",
        "## Each fitting run",
        "",
        "Error = expected / measured - 1, at the fit of every fitting run (in sample) and at the fit without the",
        "run (left out: an out-of-sample error).",
        "",
        "| run | route | in sample | left out |",
        "|---|---|---|---|",
        *(
            f"| {e.run} | {e.route} | {100 * e.in_sample:+.1f}% | "
            f"{'–' if e.left_out is None else f'{100 * e.left_out:+.1f}%'} |"
            for e in found
        ),
        "",
        f"- TPU route: MAPE {mape(e.in_sample for e in tpu):.1f}% in sample, "
        f"{mape(e.left_out for e in tpu if e.left_out is not None):.1f}% left out, over {len(tpu)} runs",
        f"- CPU route: MAPE {mape(e.in_sample for e in cpu):.1f}% in sample, "
        f"{mape(e.left_out for e in cpu if e.left_out is not None):.1f}% left out, over {len(cpu)} runs",
        "",
        *program_counts.section(runs),
    ]
    return "\n".join(lines)


_CALIBRATION_KEY = re.compile(r"^  (mxu_efficiency|hbm_efficiency|kernel_efficiency|cpu_\w+_factor): .*$")


def table_with(text: str, at: Fit, runs: Sequence[dict[str, Any]]) -> str:
    """hardware.yaml's text with the calibration block's fitted values replaced by `at`'s (comments kept;
    the block's `generations` lines generated)."""
    constants = at.constants()
    out: list[str] = []
    lines = text.splitlines()
    start = lines.index("calibration:")
    i = 0
    while i < len(lines):
        line = lines[i]
        match = _CALIBRATION_KEY.match(line) if i > start else None
        if match and not line.startswith("   "):
            out.append(f"  {match.group(1)}: {constants[match.group(1)]:.2f}")
        elif i > start and line == "  generations:":
            out.append(line)
            i += 1
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()) and lines[i] != "":
                i += 1
            counts = {g: sum(generation_of(r) == g for r in runs) for g, _ in at.own_mxu}
            for generation, value in at.own_mxu:
                out.append(
                    f"    {generation}: {{mxu_efficiency: {value:.2f}}}  # fitted on its "
                    f"{counts[generation]} runs of benchmarks/fitting_set.yaml"
                )
            continue
        else:
            out.append(line)
        i += 1
    return "\n".join(out) + "\n"


def table_constants() -> dict[str, float]:
    """The fitted constants hardware.yaml holds now, named as `Fit.constants` names them."""
    import yaml

    calibration = yaml.safe_load(HARDWARE_TABLE.read_text())["calibration"]
    out = {k: float(v) for k, v in calibration.items() if k in Fit(0, 0, 0, 0, 0, ()).constants()}
    for generation, own in (calibration.get("generations") or {}).items():
        out[f"generations.{generation}.mxu_efficiency"] = float(own["mxu_efficiency"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loo", action="store_true", help="refit without each fitting run and predict it")
    parser.add_argument("--write", action="store_true", help="rewrite hardware.yaml's constants and CALIBRATION.md")
    parser.add_argument("--check", action="store_true", help="exit 1 when hardware.yaml or CALIBRATION.md is stale")
    parser.add_argument("--min-runs", type=int, default=MIN_RUNS, help="fitting runs a generation's own fraction needs")
    args = parser.parse_args(argv)
    if (args.write or args.check) and args.min_runs != MIN_RUNS:
        parser.error("--write and --check fit as the model does: without --min-runs")
    runs = fitting_runs(published_runs.catalogue())
    if not runs:
        print("no fitting run has a stored plan: run published_runs.py --plan first", file=sys.stderr)
        return 1
    at = fit(runs, args.min_runs)
    constants = {k: round(v, 2) for k, v in at.constants().items()}
    if args.check:
        stale = [
            f"{name}: hardware.yaml has {table_constants().get(name)}, the plans give {value:.2f}"
            for name, value in constants.items()
            if table_constants().get(name) != value
        ]
        stale += [f"{name}: in hardware.yaml, not fitted" for name in table_constants().keys() - constants.keys()]
        if not stale and (not RECORD.exists() or RECORD.read_text() != record(runs, at, leave_one_out(runs))):
            stale.append(f"{RECORD.name} is stale")
        for line in stale:
            print(f"calibration stale: {line}; run python benchmarks/calibrate.py --write", file=sys.stderr)
        return 1 if stale else 0
    loo = leave_one_out(runs, args.min_runs) if args.loo or args.write else None
    print(f"fitted on {len(runs)} runs of {published_runs.FITTING_SET.name}:")
    for name, value in constants.items():
        print(f"  {name}: {value:.2f}")
    for e in errors(runs, at, loo):
        left = "" if e.left_out is None else f"  left out {100 * e.left_out:+.1f}%"
        print(f"  {e.run:34s} {e.route}  {100 * e.in_sample:+.1f}%{left}")
    if args.write:
        assert loo is not None
        write_atomic(HARDWARE_TABLE, table_with(HARDWARE_TABLE.read_text(), at, runs))
        write_atomic(RECORD, record(runs, at, loo))
        print(f"wrote {HARDWARE_TABLE.name} and {RECORD.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
