"""`shardscope import-maxtext DIR -o plan.json`: a MaxText sharding dump as a tensors-only plan, so `diff`
and its reports work on MaxText's own dumps, before and after a change."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardscope.cli.app import JsonOption, OutputOption, app, check_writable, fail, make_console, write_output
from shardscope.errors import ShardscopeError


@app.command("import-maxtext")
def import_maxtext_command(
    directory: Annotated[
        Path, typer.Argument(metavar="DIR", help="A MaxText sharding_info/<model>/<topology>/slice_N/rule_… dump.")
    ],
    model: Annotated[
        str | None,
        typer.Option("--model", help="The model's name (default: the directory <model>/<topology>/… it is in)."),
    ] = None,
    output: OutputOption = None,
    as_json: JsonOption = False,
) -> None:
    """Reads a MaxText sharding dump (named, logical and input shardings) into a tensors-only plan."""
    from shardscope.extract.maxtext_dump import dump_to_plan  # lazy: off the --help path (no JAX)

    try:
        check_writable((output, "-o"))
        plan = dump_to_plan(directory, model)
    except ShardscopeError as err:
        fail(err)
    if write_output(plan, output) or as_json:
        if as_json and output is None:
            from shardscope.plan.json import plan_to_json  # lazy: off the --help path (no JAX)

            typer.echo(plan_to_json(plan), nl=False)
        return
    from shardscope.report.terminal import plan_summary  # lazy: off the --help path (no JAX)

    console = make_console()
    console.print(plan_summary(plan))
    if output is not None:
        console.print(f"plan written to {output}")
