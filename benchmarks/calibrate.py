"""Fits the cost model's constants (`calibration` in shardscope/case/hardware.yaml) to MaxText's published
step times of dense models, from the plans `published_runs.py --plan` stored (every route's: each stored
plan of a dense run is one point, priced as its route prices it).

The fraction of peak FLOP/s the matrix units reach on the compiled step's matmuls (`mxu_efficiency`) and of
peak HBM bandwidth its memory traffic reaches (`hbm_efficiency`) are found by a grid search (steps of 0.01)
minimising the mean squared log error of the expected step against the measured one, first over every
generation's runs together (the constants of a generation without dense runs), then `mxu_efficiency` again
for each generation with runs of its own (the matrix units and the compiler differ by generation; HBM
traffic is a small part of these steps, so its fraction stays shared). MoE runs, runs over several slices
(their traffic between slices is inferred, a floor: `published_runs.fits_constants`) and seed 003 are never
used (they validate). Two more, `cpu_memory_bytes_factor` and `cpu_gather_bytes_factor`, are fitted to compiles
rather than measurements: the TPU compile's bytes of ops without matrix work, against the CPU compile's
elementwise ones and its gathers and scatters, each at its factor, on every run planned on both routes.
Prints the fit, each fitted run's error at the fit, and the lines to put in hardware.yaml.

  python benchmarks/calibrate.py              # every constant fitted
  python benchmarks/calibrate.py --held-hbm   # hbm_efficiency held at the table's (see hardware.yaml)
"""

from __future__ import annotations

import dataclasses
import math
import sys

import published_runs

import shardscope
from shardscope.case.hardware import load_hardware
from shardscope.cost.price import price_plan
from shardscope.cost.step import expected_step

GRID = [round(0.01 * i, 2) for i in range(20, 101)]  # every fraction is searched in steps of 0.01 over it
MIN_RUNS = 2  # a generation's own constant needs two dense runs at least (one would be matched exactly)


def fitted_cases() -> list[tuple[str, str, float, object, list, object]]:
    """(run id, route, measured seconds, work profile, priced collective rows, hardware) of every stored plan
    of a fitted run."""
    cases = []
    for run in published_runs.catalogue():
        if published_runs.plannable(run) is not None:
            continue
        # A step time logged, or derived from a logged or tabled throughput (tokens per step over tokens/s).
        measured, _ = published_runs.measured_step(run)
        if not published_runs.fits_constants(run) or measured is None:
            continue
        generation = run["topology"].rsplit("-", 1)[0]
        for route in ("tpu", "cpu"):
            path = published_runs.plan_path(run, route)
            if not path.exists():
                continue
            plan = shardscope.load_plan(path)
            estimate = price_plan(plan, None if route == "tpu" else generation).estimate
            pairs = [
                *zip(plan.collectives, estimate.rows, strict=True),
                *((p.row, p.time) for p in estimate.cross_slice),
            ]
            cases.append((run["id"], route, measured, plan.work, pairs, load_hardware(generation)))
    return cases


def expected(case: tuple, mxu: float, hbm: float, kernel: float | None = None) -> float:
    _, route, _, work, pairs, hardware = case
    tuned = dataclasses.replace(hardware, mxu_efficiency=mxu, hbm_efficiency=hbm, kernel_efficiency=kernel)
    return expected_step(work, pairs, tuned, cpu_program=route == "cpu")


def loss(cases: list, mxu: float, hbm: float, kernel: float | None = None) -> float:
    return sum(math.log(expected(case, mxu, hbm, kernel) / case[2]) ** 2 for case in cases) / len(cases)


def best_fraction(objective) -> float:
    """The fraction of GRID with the least `objective` (the larger on a tie), searched in steps of 0.05
    and then of 0.01 around the best (the losses here have one minimum)."""
    coarse = min(GRID[::5], key=lambda f: (objective(f), -f))
    return min((f for f in GRID if abs(f - coarse) <= 0.05), key=lambda f: (objective(f), -f))


def best_kernels(cases: list, hbm: float) -> list[float]:
    """The kernel fractions worth fitting the generations at, for one HBM fraction: GRID in steps of 0.05,
    then in steps of 0.01 around the best of those."""
    coarse = min(GRID[::5], key=lambda k: (fit_generations(cases, hbm, k)[2], -k))
    return [k for k in GRID if abs(k - coarse) <= 0.05]


def fit_generations(cases: list, hbm: float, kernel: float) -> tuple[float, dict[str, float], float]:
    """At one HBM and kernel fraction: the shared matrix-unit fraction (every run), each generation's own
    (two runs or more), and the loss of every run priced at its generation's."""
    shared = best_fraction(lambda m: loss(cases, m, hbm, kernel))
    own: dict[str, float] = {}
    total = 0.0
    for generation in sorted({case[5].name for case in cases}):
        theirs = [case for case in cases if case[5].name == generation]
        if len({case[0] for case in theirs}) >= MIN_RUNS:
            own[generation] = best_fraction(lambda m, theirs=theirs: loss(theirs, m, hbm, kernel))
        total += loss(theirs, own.get(generation, shared), hbm, kernel) * len(theirs)
    return shared, own, total / len(cases)


def bytes_of(plan, *kinds: str) -> int:
    return sum(entry.bytes for entry in plan.work if entry.kind in kinds)


FACTOR_GRID = [round(0.01 * i, 2) for i in range(5, 401)]


def cpu_bytes_factors() -> tuple[tuple[float, float] | None, list[tuple[str, float, float]]]:
    """(memory factor, gather factor) minimising the mean squared log error of the CPU compile's bytes of ops
    without matrix work, elementwise × the one plus gathers × the other, against the TPU compile's, over every
    run planned on both routes: a fit to compiles (the TPU's is the truth), not to measurements. Also each
    run's (id, TPU / CPU bytes, the CPU's share in gathers)."""
    points = []
    for run in published_runs.catalogue():
        tpu, cpu = published_runs.plan_path(run, "tpu"), published_runs.plan_path(run, "cpu")
        if tpu.exists() and cpu.exists():
            tpu_plan, cpu_plan = shardscope.load_plan(tpu), shardscope.load_plan(cpu)
            points.append(
                (
                    run["id"],
                    bytes_of(tpu_plan, "memory", "gather", "buffer"),
                    *(bytes_of(cpu_plan, k) for k in ("memory", "gather", "buffer")),
                )
            )
    if not points:
        return None, []

    # A CPU compile's `buffer` bytes are the TPU's as counted (`shardscope.hlo.profile`): no factor.
    def loss(memory: float, gather: float) -> float:
        return sum(math.log((memory * m + gather * g + b) / t) ** 2 for _, t, m, g, b in points)

    best = min(((m, g) for m in FACTOR_GRID for g in FACTOR_GRID), key=lambda pair: (loss(*pair), pair))
    return best, [(run_id, t / (m + g + b), g / (m + g + b)) for run_id, t, m, g, b in points]


def main() -> int:
    factors, ratios = cpu_bytes_factors()
    if factors is not None:
        print(
            f"cpu_memory_bytes_factor {factors[0]:.2f}, cpu_gather_bytes_factor {factors[1]:.2f}: "
            f"fitted over {len(ratios)} runs planned on both routes"
        )
        for run_id, ratio, share in ratios:
            print(
                f"  {run_id:32s} TPU / CPU bytes of ops without matrix work {ratio:.2f} (CPU's in gathers {share:.0%})"
            )
    cases = fitted_cases()
    if not cases:
        print("no dense run has a stored plan: run published_runs.py --plan first", file=sys.stderr)
        return 1
    # The attention kernel's fraction is one for all generations (only the dense runs' share of attention,
    # 4% to 19% of their FLOPs, tells it from the matmuls'), and so is HBM's; each generation's matmul
    # fraction is fitted at every pair of them, and the pair with the least loss of every run is kept.
    # The dense runs do not fix hbm_efficiency (any fraction from 0.45 to 1.0 fits them about as well): with
    # --held-hbm the table's is kept and the other fractions are fitted at it.
    held = [load_hardware("v5p").hbm_efficiency] if "--held-hbm" in sys.argv else GRID[::5]
    fits = {(hbm, kernel): fit_generations(cases, hbm, kernel) for hbm in held for kernel in best_kernels(cases, hbm)}
    hbm, kernel = min(fits, key=lambda pair: (fits[pair][2], -pair[0], -pair[1]))
    shared, own, loss_at_fit = fits[(hbm, kernel)]
    print(
        f"fitted on {len(cases)} plans of dense runs: hbm_efficiency {hbm:.2f}, kernel_efficiency {kernel:.2f}, "
        f"mxu_efficiency {shared:.2f} over every generation (rms log error {math.sqrt(loss_at_fit):.3f})"
    )
    for generation in sorted({case[5].name for case in cases}):
        theirs = [case for case in cases if case[5].name == generation]
        runs = len({case[0] for case in theirs})
        mxu = own.get(generation, shared)
        whose = "its own" if generation in own else f"the shared one ({runs} dense run: too few for its own)"
        print(f"{generation}: mxu_efficiency {mxu:.2f}, {whose}, over {len(theirs)} plans of {runs} runs")
        for case in theirs:
            value = expected(case, mxu, hbm, kernel)
            error = value / case[2] - 1
            print(f"  {case[0]:32s} {case[1]}  measured {case[2]:7.3f} s  expected {value:7.3f} s  {error:+.1%}")
    print("hardware.yaml:\ncalibration:")
    print(f"  mxu_efficiency: {shared:.2f}\n  hbm_efficiency: {hbm:.2f}\n  kernel_efficiency: {kernel:.2f}")
    if factors is not None:
        print(f"  cpu_memory_bytes_factor: {factors[0]:.2f}\n  cpu_gather_bytes_factor: {factors[1]:.2f}")
    print("  generations:")
    for generation, value in own.items():
        print(f"    {generation}: {{mxu_efficiency: {value:.2f}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
