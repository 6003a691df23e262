"""`shardscope compare MODEL --preset A --preset B …`: presets side by side (traffic per axis, op and pass,
memory, tensor bytes), best value of each row marked; planned in parallel, through the plan cache."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shardscope.cli.app import (
    EfficiencyOption,
    HardwareOption,
    JobsOption,
    JsonOption,
    MaxTextOption,
    MaxTextPathOption,
    MeshOption,
    NoCacheOption,
    app,
    check_writable,
    fail,
    make_console,
)
from shardscope.cli.case_options import (
    check_maxtext_path,
    maxtext_variants,
    resolve_cli_case,
    resolve_cli_maxtext_case,
    with_variant,
)
from shardscope.errors import ShardscopeError

if TYPE_CHECKING:
    from shardscope.golden.cases import GoldenCase


@app.command("compare")
def compare_command(
    model: Annotated[str, typer.Argument(help="Model name, e.g. deepseek-tiny (see `shardscope list`).")],
    presets: Annotated[
        list[str] | None, typer.Option("--preset", "-p", help="A preset to compare (repeat; all built-ins if none).")
    ] = None,
    topology: Annotated[str, typer.Option("--topology", "-t", help="cpu-N or a TPU slice name.")] = "cpu-8",
    mesh: MeshOption = None,
    settings: Annotated[list[str] | None, typer.Option("--set", help="Override a setting, as for dump.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write the comparison as one HTML page.")] = None,
    as_json: JsonOption = False,
    jobs: JobsOption = 0,
    no_cache: NoCacheOption = False,
    hardware: HardwareOption = None,
    efficiency: EfficiencyOption = None,
    maxtext: MaxTextOption = None,
    maxtext_path: MaxTextPathOption = None,
) -> None:
    """Plans a model under several presets and lays them side by side, the best value of each row marked.

    For maxtext:MODEL each --preset is MaxText keys ('k=v …') added to --maxtext, or default (--maxtext as is)."""
    from shardscope.case.maxtext_model import is_maxtext_model  # lazy: off the --help path (no JAX)
    from shardscope.golden.runner import default_jobs, dump_cases

    try:
        check_maxtext_path(model, maxtext_path)
        if is_maxtext_model(model):
            names = maxtext_variants(model, presets)
            cases = _maxtext_cases(model, names, topology, mesh, settings, maxtext, maxtext_path, hardware, efficiency)
        else:
            names, cases = _preset_cases(model, presets, topology, mesh, settings, hardware, efficiency, maxtext)
        check_writable((html, "--html"))
        results = {r.case.name: r for r in dump_cases(cases, jobs or default_jobs(), use_cache=not no_cache)}
        failed = [r for r in results.values() if r.plan_json is None]
        if failed:
            raise ShardscopeError(f"preset {names[int(failed[0].case.name)]}: {failed[0].error}")
    except ShardscopeError as err:
        fail(err)
    from shardscope.diff.compare import compare_plans  # lazy: off the --help path (no JAX)
    from shardscope.plan.json import plan_from_json

    plans = [plan_from_json(results[str(i)].plan_json or "", name) for i, name in enumerate(names)]
    comparison = compare_plans(plans, [Path(n).stem if n.endswith((".yaml", ".yml")) else n for n in names])
    if html is not None:
        from shardscope.atomic import write_atomic  # lazy: off the --help path (no JAX)
        from shardscope.report.compare import render_comparison_html

        title = f"{model} on {topology}"
        priced = next((plan.estimate for plan in plans if plan.estimate is not None), None)
        if priced is not None:
            from shardscope.report.estimate_text import target_label  # lazy: off the --help path (no JAX)

            title += f", priced on {target_label(priced)} (efficiency {priced.efficiency:g})"
        write_atomic(html, render_comparison_html(comparison, title))
    if as_json:
        import json  # lazy: off the --help path (no JAX)

        typer.echo(json.dumps(comparison.to_json(), indent=2, sort_keys=True))
        return
    from shardscope.report.compare import comparison_renderable  # lazy: off the --help path (no JAX)

    console = make_console()
    console.print(comparison_renderable(comparison))
    if html is not None:
        console.print(f"comparison written to {html}")


def _preset_cases(
    model: str,
    presets: list[str] | None,
    topology: str,
    mesh: str | None,
    settings: list[str] | None,
    hardware: str | None,
    efficiency: float | None,
    maxtext: str | None,
) -> tuple[list[str], list[GoldenCase]]:
    """A reference model's cases, one per preset (all built-ins when none are named)."""
    # lazy: off the --help path (no JAX)
    from shardscope.case.presets import builtin_preset_names
    from shardscope.golden.cases import GoldenCase

    names = list(presets or builtin_preset_names())
    if len(set(names)) != len(names):
        raise ShardscopeError(f"--preset: each preset once, found {', '.join(names)}")
    if maxtext is not None:
        # Checked (and its warnings shown) once, before any compile: every preset shares the command line.
        resolve_cli_case(model, names[0], topology, mesh, settings, maxtext)
    cases = [
        GoldenCase(
            model,
            p,
            topology,
            mesh or "",
            tuple(settings or ()),
            name=f"{i}",
            hardware=hardware,
            efficiency=efficiency,
            maxtext=maxtext or "",
        )
        for i, p in enumerate(names)
    ]
    return names, cases


def _maxtext_cases(
    model: str,
    variants: list[str],
    topology: str,
    mesh: str | None,
    settings: list[str] | None,
    maxtext: str | None,
    maxtext_path: Path | None,
    hardware: str | None,
    efficiency: float | None,
) -> list[GoldenCase]:
    """MaxText's own program once per variant of its command line, each checked (model, keys, tree) before any
    compile; the variants plan in parallel as golden cases do."""
    from shardscope.golden.cases import GoldenCase  # lazy: off the --help path (no JAX)

    cases: list[GoldenCase] = []
    for i, variant in enumerate(variants):
        line = with_variant(maxtext, variant)
        resolve_cli_maxtext_case(model, topology, "default", mesh, settings, line, maxtext_path)
        path = "" if maxtext_path is None else str(maxtext_path)
        cases.append(
            GoldenCase(
                model,
                "",
                topology,
                name=f"{i}",
                hardware=hardware,
                efficiency=efficiency,
                maxtext=line,
                maxtext_path=path,
            )
        )
    return cases
