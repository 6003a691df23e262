"""The cost model on MaxText's own compiled programs: `python benchmarks/maxtext_programs.py`.

`maxtext_programs/<run>.hlo.txt.gz` are the TPU programs MaxText itself compiles for seed 003's four command
lines (MaxText's `train_compile` at the seed's commit, ahead of time for v5p-8 with libtpu; the compiled
module's text after optimisation). Each is priced by shardscope's cost model exactly as a plan of its own
compile would be (its collectives, per-op work and loop structure read from the HLO; hardware, layout and
calibration of the run's stored TPU-route plan), and set beside the measured step and shardscope's own plan
of the same command line. The difference between the two estimates is what the reference model's program
does differently from MaxText's; the difference between MaxText's program and the measurement is the cost
model's own error on that program.

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
from pathlib import Path

import published_runs
from calibrate import bytes_of

import shardscope
from shardscope.cost.price import price_plan
from shardscope.extract.collectives import extract_collectives
from shardscope.extract.plans import compute_of
from shardscope.hlo.module import read_module
from shardscope.hlo.profile import work_profile

PROGRAMS = Path(__file__).resolve().parent / "maxtext_programs"
# The same compiles' memory figures: their memory analysis and the heap their buffer assignment allocates.
MEMORY = PROGRAMS / "memory.json"
# The work kinds whose bytes are HBM traffic of ops without matrix work.
TRAFFIC = ("memory", "gather", "buffer")
# MaxText's mesh at the seed's commit: with pipeline parallelism the stage axis comes first.
MESH_AXES = ("stage", "data", "fsdp", "fsdp_transpose", "sequence", "context", "context_autoregressive")
MESH_AXES += ("tensor", "tensor_transpose", "tensor_sequence", "expert", "autoregressive")


def maxtext_mesh(plan) -> tuple[tuple[str, int], ...]:
    """MaxText's mesh of the run, in MaxText's axis order, sized as the plan's mesh."""
    sizes = dict(plan.case.mesh)
    return tuple((axis, sizes.get(axis, 1)) for axis in MESH_AXES)


def main() -> int:
    runs = {run["id"]: run for run in published_runs.catalogue()}
    found = sorted(PROGRAMS.glob("*.hlo.txt.gz"))
    if not found:
        print(f"no programs in {PROGRAMS}", file=sys.stderr)
        return 1
    print("Expected step (estimates, TPU route pricing) of MaxText's own compiled program and of shardscope's plan")
    print(
        f"{'run':28s} {'measured':>9s} {'MaxText program':>16s} {'error':>7s} {'shardscope':>11s} {'error':>7s}"
        f" {'HBM traffic MaxText / shardscope':>34s}"
    )
    for path in found:
        run_id = path.name.removesuffix(".hlo.txt.gz")
        stored = published_runs.plan_path(runs[run_id], "tpu")
        if not stored.exists():
            print(f"{run_id}: no stored TPU-route plan (python benchmarks/published_runs.py --plan {run_id})")
            continue
        ours = shardscope.load_plan(stored)
        module = read_module(gzip.decompress(path.read_bytes()).decode())
        theirs = dataclasses.replace(
            ours,
            collectives=extract_collectives(module, maxtext_mesh(ours)),
            compute=compute_of(module),
            work=work_profile(module),
        )
        measured = runs[run_id]["measured"]["step_time_s"]
        priced = [price_plan(plan, None).estimate.expected for plan in (theirs, ours)]
        errors = [f"{value / measured - 1:+.1%}" for value in priced]
        traffic = f"{bytes_of(theirs, *TRAFFIC) / 1e12:.2f} / {bytes_of(ours, *TRAFFIC) / 1e12:.2f} TB"
        print(
            f"{run_id:28s} {measured:8.2f}s {priced[0]:15.2f}s {errors[0]:>7s} {priced[1]:10.2f}s {errors[1]:>7s}"
            f" {traffic:>34s}"
        )
    print()
    print(memory_table(runs))
    return 0


def memory_table(runs: dict) -> str:
    """Each program's memory as its compile states it (the static sum arguments + outputs - aliased + temp,
    and the heap at its peak) beside the measured figure and shardscope's own plan (its compiler's peak)."""
    figures = json.loads(MEMORY.read_text())["runs"]
    lines = [
        "HBM per device (GB): MaxText's compile (static sum, heap peak) and shardscope's plan (compiler's peak)"
        " against the measured peak",
        f"{'run':28s} {'measured':>9s} {'MaxText sum':>12s} {'MaxText peak':>13s} {'error':>7s}"
        f" {'shardscope peak':>16s} {'error':>7s}",
    ]
    for run_id, theirs in sorted(figures.items()):
        measured = published_runs.maxtext_memory(runs[run_id])[0]
        static = theirs["argument_bytes"] + theirs["output_bytes"] + theirs["temp_bytes"] - theirs["alias_bytes"]
        stored = published_runs.plan_path(runs[run_id], "tpu")
        peak = dict(shardscope.load_plan(stored).memory).get("peak_bytes") if stored.exists() else None
        ours = "–" if peak is None else f"{peak / 1e9:.1f}"
        ours_error = "–" if peak is None else f"{peak / measured - 1:+.1%}"
        lines.append(
            f"{run_id:28s} {measured / 1e9:9.1f} {static / 1e9:12.1f} {theirs['heap_bytes_used'] / 1e9:13.1f}"
            f" {theirs['heap_bytes_used'] / measured - 1:+7.1%} {ours:>16s} {ours_error:>7s}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
