"""Fits the cost model's constants (`calibration` in shardscope/case/hardware.yaml) to MaxText's published
step times of dense models, from the plans `published_runs.py --plan` stored (TPU route).

Two constants, the same for every generation: the fraction of peak FLOP/s the matrix units reach on the
compiled step's matmuls (`mxu_efficiency`) and of peak HBM bandwidth its memory traffic reaches
(`hbm_efficiency`). They are found by a grid search (steps of 0.01 in (0, 1]) minimising the mean squared
log error of the expected step against the measured one; MoE runs and seed 003 are never used (they
validate). A third, `cpu_memory_bytes_factor`, is fitted to compiles rather than measurements: the TPU
compile's bytes of ops without matrix work over the CPU compile's, on every run planned on both routes.
Prints the fit, each fitted run's error at the fit, and the lines to put in hardware.yaml.

  python benchmarks/calibrate.py
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

GRID = [round(0.01 * i, 2) for i in range(20, 101)]


def fitted_cases() -> list[tuple[str, float, object, list, object]]:
    """(run id, measured seconds, work profile, priced collective rows, hardware) of every fitted run."""
    cases = []
    for run in published_runs.catalogue():
        if published_runs.plannable(run) is not None:
            continue
        measured, kind = published_runs.measured_step(run)
        path = published_runs.plan_path(run, "tpu")
        if run.get("kind") != "dense" or run.get("validation_only") or kind != "logged" or not path.exists():
            continue
        plan = shardscope.load_plan(path)
        estimate = price_plan(plan).estimate
        pairs = [*zip(plan.collectives, estimate.rows, strict=True), *((p.row, p.time) for p in estimate.cross_slice)]
        cases.append((run["id"], measured, plan.work, pairs, load_hardware(estimate.hardware)))
    return cases


def loss(cases: list, mxu: float, hbm: float) -> float:
    total = 0.0
    for _, measured, work, pairs, hardware in cases:
        tuned = dataclasses.replace(hardware, mxu_efficiency=mxu, hbm_efficiency=hbm)
        total += math.log(expected_step(work, pairs, tuned) / measured) ** 2
    return total / len(cases)


def memory_bytes(plan) -> int:
    return sum(entry.bytes for entry in plan.work if entry.kind == "memory")


def cpu_memory_factor() -> tuple[float | None, list[tuple[str, float]]]:
    """The geometric mean, over every run planned on both routes, of the TPU compile's bytes of ops without
    matrix work over the CPU compile's: a fit to compiles (the TPU's is the truth), not to measurements."""
    ratios = []
    for run in published_runs.catalogue():
        tpu, cpu = published_runs.plan_path(run, "tpu"), published_runs.plan_path(run, "cpu")
        if tpu.exists() and cpu.exists():
            ratio = memory_bytes(shardscope.load_plan(tpu)) / memory_bytes(shardscope.load_plan(cpu))
            ratios.append((run["id"], ratio))
    if not ratios:
        return None, ratios
    return math.exp(sum(math.log(r) for _, r in ratios) / len(ratios)), ratios


def main() -> int:
    factor, ratios = cpu_memory_factor()
    if factor is not None:
        print(f"cpu_memory_bytes_factor {factor:.2f}: geometric mean over {len(ratios)} runs planned on both routes")
        for run_id, ratio in ratios:
            print(f"  {run_id:32s} TPU / CPU bytes of ops without matrix work {ratio:.2f}")
    cases = fitted_cases()
    if not cases:
        print("no dense run has a stored TPU-route plan: run published_runs.py --plan first", file=sys.stderr)
        return 1
    best = min(((loss(cases, m, h), m, h) for m in GRID for h in GRID), key=lambda t: (t[0], -t[1], -t[2]))
    _, mxu, hbm = best
    print(f"fitted on {len(cases)} dense runs: mxu_efficiency {mxu:.2f}, hbm_efficiency {hbm:.2f}")
    for run_id, measured, work, pairs, hardware in cases:
        tuned = dataclasses.replace(hardware, mxu_efficiency=mxu, hbm_efficiency=hbm)
        expected = expected_step(work, pairs, tuned)
        print(f"  {run_id:32s} measured {measured:7.3f} s  expected {expected:7.3f} s  {expected / measured - 1:+.1%}")
    print("hardware.yaml:\ncalibration:")
    print(f"  mxu_efficiency: {mxu:.2f}\n  hbm_efficiency: {hbm:.2f}")
    if factor is not None:
        print(f"  cpu_memory_bytes_factor: {factor:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
