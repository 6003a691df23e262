"""`shardscope lint MODEL --preset P`: the rule mistakes reviewers catch by eye (dead and shadowed rules,
indivisible or silently replicated dimensions, names in the wrong place, involuntary rematerialisation,
expert weights gathered in the layer loop, HBM overflow, …), as findings; exit 1 when any reaches
`--fail-on`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from shardscope.cli.app import (
    JsonOption,
    MaxTextOption,
    MaxTextPathOption,
    MeshOption,
    NoCacheOption,
    PresetOption,
    app,
    fail,
    make_console,
    quiet_compiler_logs,
)
from shardscope.cli.case_options import check_maxtext_path, resolve_cli_case, resolve_cli_maxtext_case
from shardscope.cli.dump import print_unsized_mesh_note
from shardscope.errors import ShardscopeError

FAIL_ON = ("info", "warning", "error")


@app.command("lint")
def lint_command(
    model: Annotated[str | None, typer.Argument(help="Model name, e.g. deepseek-tiny (see `shardscope list`).")] = None,
    preset: PresetOption = "default",
    topology: Annotated[str, typer.Option("--topology", "-t", help="cpu-N or a TPU slice (v5p-16, …).")] = "cpu-8",
    mesh: MeshOption = None,
    slices: Annotated[int, typer.Option("--slices", help="TPU slices joined over DCN (the data axis spans them).")] = 1,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a setting: model.seq_len=64, lint.ignore=dead-rule, …"),
    ] = None,
    fail_on: Annotated[
        str, typer.Option("--fail-on", help="Exit 1 when a finding is at least this severe: info, warning, error.")
    ] = "warning",
    explain: Annotated[
        str | None, typer.Option("--explain", metavar="ID", help="Print what lint ID checks, and why.")
    ] = None,
    list_lints: Annotated[bool, typer.Option("--list", help="List every lint.")] = False,
    compile_step: Annotated[
        bool,
        typer.Option(
            "--compile/--no-compile",
            help="Also run the lints that need the compiled step (collectives, compiler warnings, TPU memory).",
        ),
    ] = True,
    hardware: Annotated[
        str | None,
        typer.Option("--hardware", help="Check HBM against this TPU generation (v5p, v6e, tpu7x, …)."),
    ] = None,
    as_json: JsonOption = False,
    no_cache: NoCacheOption = False,
    maxtext: MaxTextOption = None,
    maxtext_path: MaxTextPathOption = None,
) -> None:
    """Lint a case's sharding rules and plan. Exit 0 clean, 1 findings at or above --fail-on, 2 bad input."""
    if explain is not None or list_lints:
        _describe(explain, as_json)
        return
    try:
        if model is None:
            raise ShardscopeError("lint needs a MODEL (e.g. `shardscope lint deepseek-tiny --preset ep-as-cp`)")
        if fail_on not in FAIL_ON:
            raise ShardscopeError(f"--fail-on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
        from shardscope.case.maxtext_model import is_maxtext_model  # lazy: off the --help path (no JAX)
        from shardscope.case.topology import with_slices

        check_maxtext_path(model, maxtext_path)
        target = None
        if hardware is not None:
            from shardscope.case.hardware import load_hardware  # lazy: off the --help path (no JAX)

            target = load_hardware(hardware)
        if is_maxtext_model(model):
            maxtext_case = resolve_cli_maxtext_case(
                model, with_slices(topology, slices), preset, mesh, settings, maxtext, maxtext_path
            )
            quiet_compiler_logs()
            from shardscope.golden.planning import lint_maxtext_case  # lazy: planning loads JAX and MaxText

            report, silenced_ids = lint_maxtext_case(maxtext_case, compile=compile_step, hardware=target)
            mesh_note = None
        else:
            case = resolve_cli_case(model, preset, with_slices(topology, slices), mesh, settings, maxtext)
            mesh_note = print_unsized_mesh_note(case, preset)
            quiet_compiler_logs()
            from shardscope.golden.planning import lint_case  # lazy: planning loads JAX
            from shardscope.stages.devices import configure_devices

            configure_devices(case.topology)
            report = lint_case(case, compile=compile_step, hardware=target, use_cache=not no_cache)
            settings_lint = case.preset.lint
            silenced_ids = (*settings_lint.ignore, *(f"{i} ({t})" for i, t in settings_lint.ignore_subjects))
    except ShardscopeError as err:
        fail(err)
    from shardscope.plan.findings import severity_rank  # lazy: off the --help path (no JAX)
    from shardscope.plan.json import finding_to_json

    failing = [f for f in report.findings if severity_rank(f.severity) >= severity_rank(fail_on)]
    if as_json:
        from shardscope.diff.json import case_dict  # lazy: off the --help path (no JAX)
        from shardscope.plan.findings import count_by_severity

        payload = {
            "case": case_dict(report.plan.case),
            "compiled": report.compiled,
            "findings": [finding_to_json(f) for f in report.findings],
            "counts": count_by_severity(report.findings),
            "silenced": list(silenced_ids),
            "notes": [*report.notes, *([mesh_note] if mesh_note else [])],
        }
        typer.echo(json.dumps(payload, indent=2, sort_keys=True))
    else:
        _print_report(report, list(silenced_ids))
    raise typer.Exit(1 if failing else 0)


def _describe(lint_id: str | None, as_json: bool) -> None:
    from shardscope.case.lints import LINTS, get_lint  # lazy: off the --help path (no JAX)

    try:
        lints = [get_lint(lint_id)] if lint_id is not None else list(LINTS.values())
    except ShardscopeError as err:
        fail(err)
    if as_json:
        typer.echo(json.dumps([lint.__dict__ for lint in lints], indent=2, sort_keys=True))
        return
    console = make_console()
    if lint_id is None:
        from shardscope.report.findings import catalogue_table  # lazy: off the --help path (no JAX)

        console.print(catalogue_table())
        return
    from rich.text import Text  # lazy: rich loads only when a table is printed

    lint = lints[0]
    console.print(Text.assemble((lint.id, "bold"), f" ({lint.severity}, needs the {lint.stage}): {lint.title}"))
    console.print(Text(lint.explanation))


def _print_report(report, silenced) -> None:
    from rich.text import Text  # lazy: rich loads only when a table is printed

    from shardscope.report.findings import count_line, findings_table
    from shardscope.report.terminal import plan_header

    console = make_console()
    console.print(plan_header(report.plan))
    if report.findings:
        console.print(findings_table(report.findings))
    line = count_line(report.findings)
    if silenced:
        line += f" (the preset silences {', '.join(silenced)})"
    if not report.compiled:
        line += "; trace-based lints only"
    console.print(Text(line, "bold red" if report.findings else "bold green"))
    for note in report.notes:
        console.print(Text(f"note: {note}", "yellow"))
