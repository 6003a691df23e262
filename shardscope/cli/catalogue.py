"""`shardscope list`: models, presets, topologies and hardware shardscope knows."""

from __future__ import annotations

import json

import typer

from shardscope.cli.app import JsonOption, app, make_console


@app.command("list")
def list_command(as_json: JsonOption = False) -> None:
    """Models, presets, topologies and hardware shardscope knows."""
    from shardscope.report.catalogue import catalogue_renderables, catalogue_to_json  # lazy: off the --help path

    if as_json:
        typer.echo(json.dumps(catalogue_to_json(), indent=2, sort_keys=True))
        return
    make_console().print(*catalogue_renderables())
