"""The `shardscope` command line: a thin layer over the library, one file per command (parse, call the
library, render). Importing it imports no JAX, so `--help` is instant."""

from __future__ import annotations

import importlib

import typer

from shardscope.cli.app import app
from shardscope.interrupts import exit_on_interrupt

# Each command registers itself on `app` when its module is imported; `--help` lists them in this order.
COMMANDS = (
    "catalogue",  # list
    "dump",
    "explain",
    "collectives",
    "diff",
    "check",
    "update",
    "advise",
    "compare",
    "lint",
    "why",
    "verify",
    "maxtext",  # import-maxtext
    "table",
    "schema",
)
for _command in COMMANDS:
    importlib.import_module(f"shardscope.cli.{_command}")


def main() -> None:
    """Console-script entry point: a usage mistake (an unknown option, a missing argument) is one line and
    exit 2, like every other wrong input; Ctrl-C or SIGTERM anywhere is one line and exit 130."""
    exit_on_interrupt()
    try:
        code = app(prog_name="shardscope", standalone_mode=False)
    except typer.TyperException as err:
        format_message = getattr(err, "format_message", None)
        message = format_message() if callable(format_message) else str(err)
        context = getattr(err, "ctx", None)
        command = getattr(context, "command_path", None) or "shardscope"
        if message.strip():
            typer.echo(f"shardscope: error: {message.rstrip('.')} (see {command} --help)", err=True)
        raise SystemExit(getattr(err, "exit_code", 2)) from None
    except typer.Abort:
        raise SystemExit(130) from None
    raise SystemExit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
