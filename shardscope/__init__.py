"""shardscope: where every tensor of a sharded JAX model lives, and what the devices say to each other.

The library: `plan_case`, `plan_step`, `plan_compiled`, `load_plan`, `save_plan`, `diff_plans`,
`render_html`, `render_markdown`, `rank_shardings`; plans, diffs and advice have pandas tables
(`Plan.tensors_frame()`, `Plan.collectives_frame()`, `PlanDiff.tensor_changes_frame()`, `Advice.frame()`;
`shardscope.tables` for the groupings `shardscope table` prints). Importing it imports no JAX: each
function loads what it needs on first use.

The package is the pipeline; each folder imports only from the folders listed below it (a CI check keeps
it so):

    cli/         the command line: typer app, shared options, one thin file per command
    report/      a plan, diff, comparison, check, ranking or verification rendered: terminal, HTML, Markdown
    advise/      the best sharding searched: candidates, pruning, ranking, the sweep
    golden/      plans made end to end and guarded: planning through the plan cache, goldens, check and
                 update (and the cases' numerics, `verify:`), runners (processes, Ray)
    diff/        Plan × Plan → typed changes, grouping, JSON; several plans side by side
    lint/        findings from a Plan
    cost/        a Plan priced on a TPU: layout, collective and compute time, memory, the estimate
    verify/      real steps under two shardings (or one and a single device) compared: tolerances read from
                 the step's program, divergences placed on the plan's collectives
    extract/     a compiled or traced step (or a MaxText dump) → Plan: tensors, collectives, memory, work
    stages/      devices, abstract state, train step, trace → lower → compile, a user's own step, real
                 initial parameters
    plan/        the Plan record, its JSON, pandas frames, totals and units
    case/        what to plan: models, presets and rules, settings, topologies, TPU generations, explain
    hlo/         HLO text → instructions, collectives, loop trips, work per instruction
    atomic.py    files written whole or not at all
    errors.py    ShardscopeError (exit 2) and its kinds

Beside the pipeline, two front ends that nothing inside imports: this module (the library) and
`pytest_plugin` (golden tests of one's own functions); `tables` is the library's pandas groupings.

ARCHITECTURE.md has the records each folder hands on and how to add a model, a lint, a preset, a hardware
generation or a report section.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardscope.errors import ShardscopeError

__version__ = "0.1.0"

if TYPE_CHECKING:
    import jax

    from shardscope.advise.sweep import Advice
    from shardscope.diff.changes import PlanDiff
    from shardscope.plan.document import Plan

# Names loaded on first use (`shardscope.Plan`): their modules import pandas or deepdiff.
_LAZY = {
    "Plan": "shardscope.plan.document",
    "PlanDiff": "shardscope.diff.changes",
    "load_plan": "shardscope.plan.json",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib  # lazy: `import shardscope` loads no JAX

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'shardscope' has no attribute {name!r}")


def plan_case(
    model: str,
    preset: str | Path = "default",
    topology: str = "cpu-8",
    mesh: Mapping[str, int] | str | None = None,
    settings: Mapping[str, str] | Sequence[str] | None = None,
    *,
    maxtext: str | Sequence[str] | None = None,
    maxtext_path: str | Path | None = None,
    tensors_only: bool = False,
    use_cache: bool = True,
) -> Plan:
    """The plan of a reference model under a preset, or of MaxText's own program: what `shardscope dump`
    computes.

    Args:
      model: a model name (`shardscope list`), e.g. "deepseek2-16b"; or "maxtext:NAME", MaxText's own training
        step of any model MaxText has, configured by `maxtext` alone (its whole command line).
      preset: a built-in preset name or a path to a preset YAML (MaxText rule files load as they are).
      topology: "cpu-N" or a TPU slice name ("v5p-16", …; needs the TPU extra).
      mesh: axis sizes, as a mapping or as `--mesh` spells them ("fsdp=-1,expert=2").
      settings: `--set` overrides, as a mapping or as "key=value" strings.
      maxtext: MaxText's own command-line keys ("per_device_batch_size=4 ici_fsdp_parallelism=-1 …" or a list
        of "k=v"); they size the mesh (do not give `mesh` too) and MaxText's defaults apply to the rest. What
        MaxText accepts but is not modelled is a `warnings.warn`.
      maxtext_path: a MaxText checkout to build a "maxtext:" model from (default: the installed `maxtext`).
      tensors_only: every tensor's sharding from tracing alone, without compiling.
      use_cache: take an unchanged case's plan from the plan cache (reference models).

    Raises:
      ShardscopeError: any input that is wrong (a name, a mesh, a setting, an indivisible dimension).
    """
    # lazy: `import shardscope` loads no JAX
    from shardscope.case.maxtext_model import is_maxtext_model
    from shardscope.case.resolve import parse_overrides, resolve_case, resolve_maxtext_case
    from shardscope.case.topology import parse_mesh_arg
    from shardscope.golden.planning import plan_resolved_case

    if is_maxtext_model(model):
        return _plan_maxtext(model, str(preset), topology, mesh, settings, maxtext, maxtext_path, tensors_only)
    preset = str(preset)
    sizes = parse_mesh_arg(mesh) if isinstance(mesh, str) else dict(mesh or {})
    overrides = dict(settings) if isinstance(settings, Mapping) else parse_overrides(settings or [])
    if maxtext is None:
        case = resolve_case(model, preset, topology, sizes, overrides)
    else:
        if sizes:
            raise ShardscopeError("mesh with maxtext: size the mesh with MaxText's ici_*_parallelism keys")
        case, run = resolve_maxtext_case(
            model,
            None if preset == "default" else preset,
            None if topology == "cpu-8" else topology,
            maxtext,
            overrides,
        )
        for line in run.warnings:
            warnings.warn(line, stacklevel=2)
    return plan_resolved_case(case, tensors_only, use_cache)


def _plan_maxtext(
    model: str,
    preset: str,
    topology: str,
    mesh: Mapping[str, int] | str | None,
    settings: Mapping[str, str] | Sequence[str] | None,
    maxtext: str | Sequence[str] | None,
    maxtext_path: str | Path | None,
    tensors_only: bool,
) -> Plan:
    from shardscope.case.maxtext_model import resolve_maxtext_model  # lazy: `import shardscope` loads no JAX
    from shardscope.case.maxtext_run import parse_maxtext_args
    from shardscope.case.topology import get_topology
    from shardscope.golden.pipeline import plan_maxtext_case

    if preset != "default" or mesh or settings:
        raise ShardscopeError(f"{model} is configured by MaxText's command line alone: pass it as maxtext=…")
    path = None if maxtext_path is None else Path(maxtext_path)
    case = resolve_maxtext_model(model, get_topology(topology), parse_maxtext_args(maxtext or ""), path)
    for line in case.notes:
        warnings.warn(line, stacklevel=3)
    return plan_maxtext_case(case, tensors_only)


def plan_compiled(compiled: Any, mesh: jax.sharding.Mesh, name: str = "step") -> Plan:
    """The plan of any compiled JAX function (`jax.jit(f).lower(*args).compile()`) on its mesh: its inputs'
    and outputs' shardings, the collectives the compiler emitted, and its memory."""
    from shardscope.extract.plans import plan_from_compiled  # lazy: `import shardscope` loads no JAX

    return plan_from_compiled(compiled, mesh, name)


def plan_step(step: Any, args: Sequence[Any], mesh: jax.sharding.Mesh, name: str = "step") -> Plan:
    """Lowers and compiles a jitted function on `args` (arrays or `jax.ShapeDtypeStruct`s) and plans it.

    Args:
      step: a `jax.jit`-wrapped function (with its in/out shardings, if any).
      args: its positional arguments; abstract ones allocate nothing.
      mesh: the mesh its shardings refer to (it is set while tracing, as explicit sharding needs).
      name: the plan's model and preset name.
    """
    from shardscope.stages.user_step import compile_step  # lazy: `import shardscope` loads no JAX

    return plan_compiled(compile_step(step, args, mesh), mesh, name)


def diff_plans(old: Plan, new: Plan) -> PlanDiff:
    """What changed from `old` to `new`, by meaning (see `shardscope.diff`)."""
    from shardscope.diff.plans import diff_plans as _diff_plans  # lazy: `import shardscope` loads no JAX

    return _diff_plans(old, new)


def save_plan(plan: Plan, path: Path | str) -> None:
    """Writes a plan's canonical JSON atomically."""
    from shardscope.atomic import write_atomic  # lazy: `import shardscope` loads no JAX
    from shardscope.plan.json import plan_to_json

    write_atomic(Path(path), plan_to_json(plan))


def render_html(diffs: PlanDiff | Sequence[PlanDiff]) -> str:
    """One self-contained HTML page for one diff or several."""
    from shardscope.diff.changes import PlanDiff  # lazy: `import shardscope` loads no JAX
    from shardscope.report.html import render_html_many

    return render_html_many([diffs] if isinstance(diffs, PlanDiff) else list(diffs))


def render_markdown(diff: PlanDiff) -> str:
    """The Markdown summary of a diff (fits a pull-request comment)."""
    from shardscope.report.markdown import render_markdown as _render_markdown  # lazy: no JAX on import

    return _render_markdown(diff)


def rank_shardings(
    model: str,
    topology: str = "cpu-8",
    presets: Sequence[str | Path] | None = None,
    mesh: Mapping[str, int] | str | None = None,
    settings: Mapping[str, str] | Sequence[str] | None = None,
    *,
    hardware: str | None = None,
    efficiency: float | None = None,
    jobs: int = 0,
    use_cache: bool = True,
    ray: str | None = None,
    confirm: int = 0,
    predict_only: bool = False,
) -> Advice:
    """Every mesh of the topology's devices under each preset, pruned, priced by prediction, compiled and
    ranked by estimated step time among the plans that fit in HBM: what `shardscope advise` computes
    (`Advice.frame()` is its table; its `source` column says compiled or predicted).

    Args:
      presets: built-in names or preset files (all built-ins when None).
      mesh: axes held at a size while the others are searched, e.g. {"data": 1} or "data=1,stage=1".
      hardware: the generation a cpu-N topology is priced on (v5p when None; a TPU topology prices as itself).
      jobs: worker processes (0: one per core), or Ray workers with `ray` (0: one per CPU of the cluster).
        Each worker process runs the calling script again as it starts (Python's spawn start method), so a
        script calls this under `if __name__ == "__main__":`; called at its top level, it fails saying so.
      ray: a Ray cluster's address to compile on (host:port), instead of local processes.
      confirm: compile only the best `confirm` predicted candidates (and those within a tenth of the best);
        0 (the default here) compiles every candidate screening passes, as `advise --confirm 0`.
      predict_only: compile nothing; rank by prediction alone.

    Raises:
      ShardscopeError: any input that is wrong, before anything compiles.
    """
    from shardscope.advise.sweep import advise as run_sweep  # lazy: `import shardscope` loads no JAX
    from shardscope.advise.sweep import make_request
    from shardscope.golden.runner import default_jobs

    names = None if presets is None else [str(p) for p in presets]
    request = make_request(model, topology, names, mesh, settings, hardware, efficiency, confirm)
    request = dataclasses.replace(request, predict_only=predict_only)
    if ray is not None:
        from shardscope.golden.ray_pool import check_reachable  # lazy: Ray is an optional extra

        check_reachable(ray)
    return run_sweep(request, jobs if ray is not None else jobs or default_jobs(), use_cache, ray)


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
