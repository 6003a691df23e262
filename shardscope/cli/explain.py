"""`shardscope explain --preset P AXIS…`: the physical spec of a logical-axes tuple, and which rule decided each
dimension (no devices, no JAX)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from shardscope.cli.app import MeshOption, PresetOption, app, fail, make_console
from shardscope.errors import ShardscopeError


@app.command("explain")
def explain_command(
    axes: Annotated[list[str], typer.Argument(help="Logical axis names, one per dimension (None = unnamed).")],
    preset: PresetOption = "default",
    mesh: MeshOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {spec, dims} as JSON.")] = False,
) -> None:
    """Physical spec of a logical-axes tuple under a preset, and which rule decided each dimension."""
    # lazy: off the --help path
    from shardscope.case.explain import explain_axes
    from shardscope.case.presets import get_preset
    from shardscope.case.topology import parse_mesh_arg

    try:
        resolved = get_preset(preset)
        explanation = explain_axes(resolved, axes, parse_mesh_arg(mesh or ""))
    except ShardscopeError as err:
        fail(err)
    if as_json:
        typer.echo(json.dumps(explanation.to_json(), indent=2, sort_keys=True))
        return
    from shardscope.report.terminal import explain_renderable  # lazy: off the --help path

    make_console().print(
        explain_renderable(explanation.logical, explanation.decisions, resolved.logical_axis_rules, explanation.notes)
    )
