"""`shardscope compare MODEL --preset A --preset B …`: presets side by side (traffic per axis, op and pass,
memory, tensor bytes), best value of each row marked; planned in parallel, through the plan cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardscope.cli.app import (
    EfficiencyOption,
    HardwareOption,
    JobsOption,
    JsonOption,
    MaxTextOption,
    MeshOption,
    NoCacheOption,
    app,
    check_writable,
    fail,
    make_console,
)
from shardscope.cli.case_options import resolve_cli_case
from shardscope.errors import ShardscopeError


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
) -> None:
    """Plans a model under several presets and lays them side by side, the best value of each row marked."""
    from shardscope.case.presets import builtin_preset_names  # lazy: off the --help path (no JAX)
    from shardscope.golden.cases import GoldenCase
    from shardscope.golden.runner import default_jobs, dump_cases

    names = list(presets or builtin_preset_names())
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
    try:
        if len(set(names)) != len(names):
            raise ShardscopeError(f"--preset: each preset once, found {', '.join(names)}")
        if maxtext is not None:
            # Checked (and its warnings shown) once, before any compile: every preset shares the command line.
            resolve_cli_case(model, names[0], topology, mesh, settings, maxtext)
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
