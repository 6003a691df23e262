"""The prediction's pass counts (`shardscope.predict.pipeline_work.counts`) as benchmarks/CALIBRATION.md
records them: each with its value and what it counts, and whether the fitting set could have fitted it.

They are pipelines' own HBM passes: only a pipelined fitting run's measured step could determine them, and
`benchmarks/fitting_set.yaml` names none (`pipelined` finds them from the runs' stored plans: a layer stack
split over a stage axis). So they are counted from the program's structure, and seed 003's compiles, which
are validation runs, check them without choosing them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import published_runs

import shardscope
from shardscope.predict.layout import placement_of
from shardscope.predict.pipeline_work import counts


def pipelined(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The runs whose stored plans (either route) pipeline their layers: a stack split over stages."""
    found = []
    for run in runs:
        paths = [published_runs.plan_path(run, route) for route in published_runs.ROUTES]
        path = next((p for p in paths if p.exists()), None)
        if path is not None and any(w.stack_axes for w in placement_of(shardscope.load_plan(path)).weights):
            found.append(run["id"])
    return found


def section(runs: Sequence[dict[str, Any]]) -> list[str]:
    """CALIBRATION.md's section on the counted constants."""
    staged = pipelined(runs)
    fitting = (
        [f"The fitting set has {len(staged)} pipelined runs ({', '.join(staged)}): the counts are not fitted to them."]
        if staged
        else [
            "The fitting set has no pipelined run, so no measured step determines them: each is counted from what",
            "the program does, not fitted. Seed 003's four runs (validation) check them, never choose them.",
        ]
    )
    return [
        "## Counted from the program",
        "",
        "The prediction's passes over a pipeline's own arrays (`shardscope/predict/pipeline_work.py`).",
        *fitting,
        "",
        "| count | value | what is counted |",
        "|---|---|---|",
        *(f"| `{c.name}` | {c.value:g} | {c.counts} |" for c in counts()),
        "",
    ]
