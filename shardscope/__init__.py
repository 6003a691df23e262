"""shardscope: where every tensor of a sharded JAX model lives, and what the devices say to each other.

The library (`shardscope.api`, re-exported here): `plan_case`, `plan_step`, `plan_compiled`, `load_plan`,
`save_plan`, `diff_plans`, `render_html`, `render_markdown`, `rank_shardings`; plans, diffs and
advice have pandas tables (`Plan.tensors_frame()`, `Plan.collectives_frame()`, `PlanDiff.tensor_changes_frame()`,
`Advice.frame()`, …).

The pipeline, one module per stage: `presets` and `rules` (logical → physical), `topology` and `tpu`
(devices and meshes), `compile` (the train step, traced, lowered and compiled), `extract` and `hlo` (the
plan: tensors, collectives, memory), `plan` (the record and its JSON), `diff` and `report` (changes,
rendered), `tables` (pandas), `golden`, `check` and `cache` (guarding plans), `runner` and `ray_pool`
(many cases compiled by local processes or on a Ray cluster), `advise` (the best sharding searched: space,
template, prune, rank, sweep, export), `cli` (the command line).
Importing this package imports no JAX: the library's names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = (
    "Plan",
    "PlanDiff",
    "diff_plans",
    "load_plan",
    "plan_case",
    "plan_compiled",
    "plan_step",
    "rank_shardings",
    "render_html",
    "render_markdown",
    "save_plan",
)

if TYPE_CHECKING:
    from shardscope.api import (
        Plan,
        PlanDiff,
        diff_plans,
        load_plan,
        plan_case,
        plan_compiled,
        plan_step,
        rank_shardings,
        render_html,
        render_markdown,
        save_plan,
    )


def __getattr__(name: str) -> Any:
    if name in _API:
        from shardscope import api

        return getattr(api, name)
    raise AttributeError(f"module 'shardscope' has no attribute {name!r}")


__all__ = [
    "Plan",
    "PlanDiff",
    "__version__",
    "diff_plans",
    "load_plan",
    "plan_case",
    "plan_compiled",
    "plan_step",
    "rank_shardings",
    "render_html",
    "render_markdown",
    "save_plan",
]
