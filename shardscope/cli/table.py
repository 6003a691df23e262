"""`shardscope table PLAN`: a plan as pandas-grouped tables (traffic by axis, op, pass, …, or the tensors),
printed, as CSV, or as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardscope.cli.app import JsonOption, app, check_writable, fail, make_console
from shardscope.errors import ShardscopeError


@app.command("table")
def table_command(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="A plan JSON (shardscope dump -o).")],
    by: Annotated[
        str, typer.Option("--by", help="Group traffic by these, comma-separated: axis, op, pass, source, dtype.")
    ] = "axis",
    tensors: Annotated[bool, typer.Option("--tensors", help="The tensors table instead of traffic.")] = False,
    csv: Annotated[Path | None, typer.Option("--csv", help="Write the table as CSV here (- for stdout).")] = None,
    as_json: JsonOption = False,
) -> None:
    """A plan's traffic grouped by mesh axis, op, pass (or the tensors), as a table, CSV or JSON."""
    from shardscope.plan.frames import GROUPINGS, tensors_frame, traffic_by  # lazy: off the --help path (no JAX)
    from shardscope.plan.json import load_plan

    try:
        check_writable((csv, "--csv"))
        plan = load_plan(plan_file)
        if tensors:
            frame = tensors_frame(plan)
        else:
            groups = [name.strip() for name in by.split(",") if name.strip()]
            unknown = [name for name in groups if name not in GROUPINGS]
            if unknown or not groups:
                raise ShardscopeError(f"--by {by!r}: expected some of {', '.join(GROUPINGS)}, comma-separated")
            if not plan.holds("collectives"):
                raise ShardscopeError(f"{plan_file} holds tensors only (made without compiling): no traffic to group")
            frame = traffic_by(plan, groups)
        if csv is not None and str(csv) != "-":
            from shardscope.atomic import write_atomic  # lazy: off the --help path (no JAX)

            write_atomic(csv, frame.to_csv(index=False))
    except ShardscopeError as err:
        fail(err)
    if csv is not None and str(csv) == "-":
        typer.echo(frame.to_csv(index=False), nl=False)
        return
    if as_json:
        typer.echo(frame.to_json(orient="records", indent=2))
        return
    from shardscope.report.terminal import frame_table  # lazy: off the --help path (no JAX)

    if tensors:
        frame = frame[["path", "kind", "shape", "logical", "sharded_over", "bytes_per_device"]]
    title = f"{plan_file.name}: " + ("tensors" if tensors else f"traffic by {by}")
    make_console().print(frame_table(frame, title=title))
    if csv is not None:
        make_console().print(f"table written to {csv}")
