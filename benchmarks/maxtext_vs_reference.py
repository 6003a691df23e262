"""MaxText's own program (`maxtext:MODEL`) beside shardscope's reference model, on published runs of both.

For each run below, the reference model's TPU plan is the one the published-runs benchmark keeps
(`plans/<id>.tpu.json`); the `maxtext:` plan is MaxText's own training step compiled for the same TPU topology
from the same command line (`plans/<id>.maxtext.json`, made with `--plan`, which needs the `[maxtext]` extra
and Python 3.12). The report sets them side by side: the train state's tensors (path, shape, logical axes,
spec), traffic per mesh axis, the HBM need and the expected step, each priced on the run's own TPU.

    python benchmarks/maxtext_vs_reference.py --plan     # compile the maxtext: plans (minutes each)
    python benchmarks/maxtext_vs_reference.py            # the table, from the stored plans
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
PLANS = ROOT / "plans"
RUNS = ("deepseek2-16b_v5p-8_doc", "llama3.1-8b_v6e-8_tr014", "mixtral-8x7b_v6e-256_tr010")
# The run's XLA flags that decide which ops its program has, as the published-runs benchmark passes them.
PROGRAM_FLAGS = ("xla_jf_spmd_threshold_for_windowed_einsum_mib", "xla_tpu_scoped_vmem_limit_kib")
# Keys that only steer a run (data, profiling, metrics, tokenizer files): MaxText's config of this version
# reads some of them as files or services at start-up.
RUN_ONLY = ("dataset_path", "tokenizer_path", "profiler", "gcs_metrics", "skip_first_n_steps_for_profiler")


def run_of(run_id: str) -> dict[str, Any]:
    runs = yaml.safe_load((ROOT / "published_runs.yaml").read_text())["runs"]
    return next(r for r in runs if r["id"] == run_id)


def maxtext_words(run: dict[str, Any]) -> str:
    """The run's command line for `--maxtext`: without model_name (it is the model) and run-only keys, with the
    program-shaping XLA flags as MaxText's `compile_xla_flags`."""
    words = [w for w in run["overrides"].split() if w.split("=", 1)[0] not in ("model_name", *RUN_ONLY)]
    flags = [w for w in (run.get("xla_flags") or "").split() if w.removeprefix("--").split("=", 1)[0] in PROGRAM_FLAGS]
    if flags:
        words.append(f"compile_xla_flags='{' '.join(flags)}'")
    return " ".join(words)


def plan(run_id: str) -> None:
    import subprocess

    run = run_of(run_id)
    out = PLANS / f"{run_id}.maxtext.json"
    command = [str(Path(sys.executable).parent / "shardscope"), "dump", f"maxtext:{run['model']}"]
    command += ["--topology", run["topology"], "--maxtext", maxtext_words(run), "-o", str(out)]
    if run["num_slices"] > 1:
        command += ["--slices", str(run["num_slices"])]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def _state(plan: Any) -> dict[str, Any]:
    """The train state's tensors (an NNX model's RNG keys and counts aside: the reference models carry none),
    a scalar's logical axes () and None alike."""
    return {
        p: (t.shape, t.logical or None, t.spec)
        for p, t in plan.tensors
        if t.kind in ("param", "opt_state") and "/rngs/" not in p
    }


def _traffic_by_axis(plan: Any) -> dict[str, int]:
    totals: dict[str, int] = {}
    for row in plan.collectives:
        axes = "+".join(row.axes) if row.axes else "?"
        totals[axes] = totals.get(axes, 0) + (row.traffic or 0)
    return totals


def _pct(new: float, old: float) -> str:
    return f"{100 * (new - old) / old:+.1f}%" if old else "n/a"


def report() -> int:
    import shardscope
    from shardscope.cost.price import price_plan

    for run_id in RUNS:
        paths = PLANS / f"{run_id}.tpu.json", PLANS / f"{run_id}.maxtext.json"
        if not all(p.exists() for p in paths):
            print(f"{run_id}: no maxtext: plan yet (run with --plan)")
            continue
        reference, maxtext = (price_plan(shardscope.load_plan(p), None, None) for p in paths)
        ours, theirs = _state(reference), _state(maxtext)
        same = sum(1 for p in ours if theirs.get(p) == ours[p])
        print(
            f"{run_id}: train state {same}/{len(ours)} reference tensors identical in the maxtext: plan "
            f"({len(theirs)} there)"
        )
        for path in sorted(set(ours) ^ set(theirs))[:5]:
            print(f"  only in {'reference' if path in ours else 'maxtext:'}: {path}")
        for path in sorted(p for p in set(ours) & set(theirs) if ours[p] != theirs[p])[:5]:
            print(f"  differs: {path}: {ours[path]} vs {theirs[path]}")
        a, b = _traffic_by_axis(reference), _traffic_by_axis(maxtext)
        for axes in sorted(set(a) | set(b)):
            print(
                f"  traffic {axes}: {a.get(axes, 0) / 2**30:.2f} GiB vs {b.get(axes, 0) / 2**30:.2f} GiB "
                f"({_pct(b.get(axes, 0), a.get(axes, 0))})"
            )
        for kind in sorted({b.kind for b in (*reference.work, *maxtext.work)}):
            f = [sum(b.flops for b in p.work if b.kind == kind) for p in (reference, maxtext)]
            n = [sum(b.bytes for b in p.work if b.kind == kind) for p in (reference, maxtext)]
            print(
                f"  work {kind}: {f[0] / 1e12:.1f} vs {f[1] / 1e12:.1f} TFLOP ({_pct(f[1], f[0])}), "
                f"{n[0] / 1e9:.1f} vs {n[1] / 1e9:.1f} GB of HBM ({_pct(n[1], n[0])})"
            )
        hbm = reference.estimate.memory.total, maxtext.estimate.memory.total
        step = reference.estimate.expected, maxtext.estimate.expected
        print(
            f"  HBM need {hbm[0] / 2**30:.1f} vs {hbm[1] / 2**30:.1f} GiB ({_pct(hbm[1], hbm[0])}); expected step "
            f"{step[0]:.3f} vs {step[1]:.3f} s ({_pct(step[1], step[0])}) (estimates from TPU compiles)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", nargs="*", metavar="RUN", help="compile the maxtext: plans (all when none named)")
    args = parser.parse_args(argv)
    if args.plan is not None:
        for run_id in args.plan or RUNS:
            plan(run_id)
    return report()


if __name__ == "__main__":
    sys.exit(main())
