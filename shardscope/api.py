"""shardscope as a library: plan a reference case or any jitted step, read and write plans, diff them, render
reports. The command line is a thin layer over these functions.

```python
import shardscope

plan = shardscope.plan_case("deepseek-tiny", "ep-as-cp")            # a reference model under a preset
plan = shardscope.plan_step(jax.jit(step, in_shardings=…), args, mesh)  # any JAX program
plan.tensors_frame(); plan.collectives_frame()                        # pandas tables
diff = shardscope.diff_plans(old, new); diff.tensor_changes_frame()
advice = shardscope.rank_shardings("deepseek-tiny", presets=["ep-tp"]); advice.frame()  # meshes ranked
html = shardscope.render_html(diff)
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardscope.diff import PlanDiff
from shardscope.diff import diff_plans as _diff_plans
from shardscope.plan import Plan, load_plan, plan_to_json

if TYPE_CHECKING:
    import jax

    from shardscope.case import Case


def plan_case(
    model: str,
    preset: str = "default",
    topology: str = "cpu-8",
    mesh: Mapping[str, int] | str | None = None,
    settings: Mapping[str, str] | Sequence[str] | None = None,
    *,
    tensors_only: bool = False,
    use_cache: bool = True,
) -> Plan:
    """The plan of a reference model under a preset: what `shardscope dump` computes.

    Args:
      model: a model name (`shardscope list`), e.g. "deepseek2-16b".
      preset: a built-in preset name or a path to a preset YAML (MaxText rule files load as they are).
      topology: "cpu-N" or a TPU slice name ("v5p-16", …; needs the TPU extra).
      mesh: axis sizes, as a mapping or as `--mesh` spells them ("fsdp=-1,expert=2").
      settings: `--set` overrides, as a mapping or as "key=value" strings.
      tensors_only: every tensor's sharding from tracing alone, without compiling.
      use_cache: take an unchanged case's plan from the plan cache.

    Raises:
      ShardscopeError: any input that is wrong (a name, a mesh, a setting, an indivisible dimension).
    """
    from shardscope.case import parse_overrides, resolve_case
    from shardscope.topology import parse_mesh_arg

    sizes = parse_mesh_arg(mesh) if isinstance(mesh, str) else dict(mesh or {})
    overrides = dict(settings) if isinstance(settings, Mapping) else parse_overrides(settings or [])
    return plan_resolved_case(resolve_case(model, preset, topology, sizes, overrides), tensors_only, use_cache)


def plan_resolved_case(case: Case, tensors_only: bool = False, use_cache: bool = True) -> Plan:
    """The plan of a validated case: from the plan cache when its inputs are unchanged, else planned (and
    cached). A cache hit starts no JAX backend."""
    from shardscope.cache import case_key, load_plan_text, store
    from shardscope.plan import plan_from_json

    key = case_key(case, tensors_only) if use_cache else None
    cached = load_plan_text(key) if key is not None else None
    if cached is not None:
        return plan_from_json(cached, "cached plan")
    from shardscope.extract import plan_case as _plan_case
    from shardscope.topology import configure_devices

    configure_devices(case.topology)
    plan = _plan_case(case, tensors_only=tensors_only)
    if key is not None:
        store(key, plan_to_json(plan))
    return plan


def plan_compiled(compiled: Any, mesh: jax.sharding.Mesh, name: str = "step") -> Plan:
    """The plan of any compiled JAX function (`jax.jit(f).lower(*args).compile()`) on its mesh: its inputs'
    and outputs' shardings, the collectives the compiler emitted, and its memory."""
    from shardscope.extract import plan_from_compiled

    return plan_from_compiled(compiled, mesh, name)


def plan_step(step: Any, args: Sequence[Any], mesh: jax.sharding.Mesh, name: str = "step") -> Plan:
    """Lowers and compiles a jitted function on `args` (arrays or `jax.ShapeDtypeStruct`s) and plans it.

    Args:
      step: a `jax.jit`-wrapped function (with its in/out shardings, if any).
      args: its positional arguments; abstract ones allocate nothing.
      mesh: the mesh its shardings refer to (it is set while tracing, as explicit sharding needs).
      name: the plan's model and preset name.
    """
    import jax

    with jax.set_mesh(mesh):
        compiled = step.lower(*args).compile()
    return plan_compiled(compiled, mesh, name)


def diff_plans(old: Plan, new: Plan) -> PlanDiff:
    """What changed from `old` to `new`, by meaning (see `shardscope.diff`)."""
    return _diff_plans(old, new)


def save_plan(plan: Plan, path: Path | str) -> None:
    """Writes a plan's canonical JSON atomically."""
    from shardscope.atomic import write_atomic

    write_atomic(Path(path), plan_to_json(plan))


def render_html(diffs: PlanDiff | Sequence[PlanDiff]) -> str:
    """One self-contained HTML page for one diff or several."""
    from shardscope.report.html import render_html_many

    return render_html_many([diffs] if isinstance(diffs, PlanDiff) else list(diffs))


def render_markdown(diff: PlanDiff) -> str:
    """The Markdown summary of a diff (fits a pull-request comment)."""
    from shardscope.report.markdown import render_markdown as _render_markdown

    return _render_markdown(diff)


__all__ = [
    "Plan",
    "PlanDiff",
    "diff_plans",
    "load_plan",
    "plan_case",
    "plan_compiled",
    "plan_step",
    "render_html",
    "render_markdown",
    "save_plan",
]


def rank_shardings(
    model: str,
    topology: str = "cpu-8",
    presets: Sequence[str] | None = None,
    mesh: Mapping[str, int] | str | None = None,
    settings: Mapping[str, str] | Sequence[str] | None = None,
    *,
    hardware: str | None = None,
    efficiency: float | None = None,
    jobs: int = 0,
    use_cache: bool = True,
    ray: str | None = None,
):
    """Every mesh of the topology's devices under each preset, pruned, compiled and ranked by estimated step
    time among the plans that fit in HBM: what `shardscope advise` computes (`Advice.frame()` is its table).

    Args:
      presets: built-in names or preset files (all built-ins when None).
      mesh: axes held at a size while the others are searched, e.g. {"data": 1} or "data=1,stage=1".
      hardware: the generation a cpu-N topology is priced on (v5p when None; a TPU topology prices as itself).
      jobs: worker processes (0: one per core), or Ray workers with `ray` (0: one per CPU of the cluster).
      ray: a Ray cluster's address to compile on (host:port), instead of local processes.

    Raises:
      ShardscopeError: any input that is wrong, before anything compiles.
    """
    from shardscope.advise.sweep import advise as run_sweep
    from shardscope.advise.sweep import make_request
    from shardscope.runner import default_jobs

    request = make_request(model, topology, presets, mesh, settings, hardware, efficiency)
    if ray is not None:
        from shardscope.ray_pool import check_reachable

        check_reachable(ray)
    return run_sweep(request, jobs if ray is not None else jobs or default_jobs(), use_cache, ray)
