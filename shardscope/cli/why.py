"""`shardscope why PLAN [--op OP] [--axes A] [--source PATH]`: why each matching collective runs, from the rule
to the tensor it placed to the op that needs that tensor in another layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shardscope.cli.app import app, fail
from shardscope.errors import ShardscopeError


@app.command("why")
def why_command(
    plan_file: Annotated[Path, typer.Argument(help="A plan JSON (`shardscope dump -o`, a golden).")],
    op: Annotated[str | None, typer.Option("--op", help="Only this collective op, e.g. all-gather.")] = None,
    axes: Annotated[
        str | None, typer.Option("--axes", help="Only collectives over exactly these mesh axes (fsdp,expert).")
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--source", help="Only collectives of this module path (decoder/moe_layers) or model file (moe.py[:81])."
        ),
    ] = None,
    hardware: Annotated[
        str | None,
        typer.Option("--hardware", help="Price on this TPU generation (a CPU plan is not priced otherwise)."),
    ] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Every matching row (default: the 10 largest).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the matching rows with their causes as JSON.")] = False,
) -> None:
    """Why each collective runs: the rule, the tensor it placed, and the op that needs it moved."""
    # lazy: off the --help path
    from shardscope.cost.price import price_plan
    from shardscope.plan.json import collective_to_json, load_plan
    from shardscope.plan.why import why_rows

    try:
        if _is_hlo(plan_file):
            raise ShardscopeError(
                f"{plan_file} is an HLO module, not a plan: bare HLO records no causes (`shardscope dump` makes a"
                " plan that has them)"
            )
        plan = load_plan(plan_file)
        if hardware is not None or (plan.estimate is None and plan.holds("collectives")):
            plan = price_plan(plan, hardware)
        rows = why_rows(plan, op, axes, source)
    except ShardscopeError as err:
        fail(err)
    if as_json:
        payload = [{**collective_to_json(r.row), "seconds": r.seconds} for r in rows]
        typer.echo(json.dumps(payload, indent=2, sort_keys=True))
        return
    if not rows:
        typer.echo("no collective of this plan matches")
        return
    from shardscope.report.why import why_lines  # lazy: off the --help path

    typer.echo("\n".join(why_lines(plan, rows, None if show_all else 10)).rstrip("\n"))


def _is_hlo(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False  # load_plan says why
    return head.lstrip().startswith(b"HloModule")
