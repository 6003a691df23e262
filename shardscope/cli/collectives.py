"""`shardscope collectives HLO.txt [--mesh …]`: the collectives table of any XLA HLO text dump, in your mesh axes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shardscope.cli.app import app, fail, make_console
from shardscope.errors import ShardscopeError


@app.command("collectives")
def collectives_command(
    hlo_file: Annotated[Path, typer.Argument(help="HLO text (Compiled.as_text(), or an --xla_dump_to *.txt).")],
    mesh: Annotated[
        str | None,
        typer.Option(
            "--mesh", help="The mesh in order, e.g. data=1,fsdp=4,expert=2; without it, device groups are shown."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """The collectives table of any HLO text file, in your mesh axes."""
    from shardscope.extract.collectives import collective_rows, hlo_file_collectives  # lazy: off the --help path

    try:
        parsed = hlo_file_collectives(hlo_file, mesh)
    except ShardscopeError as err:
        fail(err)
    if as_json:
        payload = {
            "collectives": [c.to_dict() for c in parsed.collectives],
            "unknown": [u.__dict__ for u in parsed.unknown],
            "notices": list(parsed.notices),
        }
        typer.echo(json.dumps(payload, indent=2, sort_keys=True))
        return
    from shardscope.report.terminal import collectives_table, traffic_tables  # lazy: off the --help path

    rows = collective_rows(parsed)
    console = make_console()
    console.print(collectives_table(rows), "", traffic_tables(rows))
    for unknown in parsed.unknown:
        console.print(f"[yellow]not understood:[/] {unknown.op} (line {unknown.line})")
    for notice in parsed.notices:
        typer.echo(f"shardscope: warning: {hlo_file}: {notice}", err=True)
