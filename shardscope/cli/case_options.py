"""The case the command-line options name (`--preset`/`--mesh`/`--set`, or MaxText's `--maxtext`), with its
warnings on standard error."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

from shardscope.errors import ShardscopeError

if TYPE_CHECKING:
    from shardscope.case.resolve import Case


def warn(lines: Sequence[str]) -> None:
    """Warnings, one line each, on standard error (the output stays clean for pipes)."""
    for line in lines:
        typer.echo(f"warning: {line}", err=True)


def resolve_cli_case(
    model: str,
    preset: str,
    topology: str,
    mesh: str | None,
    settings: Sequence[str] | None,
    maxtext: str | None,
) -> Case:
    """The case the options name: `--maxtext` (MaxText's keys size the mesh and pick the rules; an explicit
    `--preset`/`--topology` must agree with them) or `--preset`/`--mesh`; warnings printed on standard error.

    Raises:
      ShardscopeError: any input that is wrong.
    """
    # lazy: off the --help path
    from shardscope.case.resolve import parse_overrides, resolve_case, resolve_maxtext_case
    from shardscope.case.topology import parse_mesh_arg

    if maxtext is None:
        return resolve_case(model, preset, topology, parse_mesh_arg(mesh or ""), parse_overrides(settings or []))
    if mesh:
        raise ShardscopeError("--mesh with --maxtext: size the mesh with MaxText's ici_*_parallelism keys")
    chosen_preset = None if preset == "default" else preset
    chosen_topology = None if topology == "cpu-8" else topology
    case, run = resolve_maxtext_case(model, chosen_preset, chosen_topology, maxtext, parse_overrides(settings or []))
    warn(run.warnings)
    return case
