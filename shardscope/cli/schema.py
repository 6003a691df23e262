"""`shardscope schema [plan|diff]`: the published JSON Schema of the plan JSON (`shardscope.plan/1`) or of the
diff JSON (`shardscope diff --json`), as the package ships it."""

from __future__ import annotations

from typing import Annotated

import typer

from shardscope.cli.app import app, fail
from shardscope.errors import unknown_name

# What each name prints: the package and file of its shipped schema.
SCHEMAS = {"plan": ("shardscope.plan", "plan.schema.json"), "diff": ("shardscope.diff", "diff.schema.json")}


@app.command("schema")
def schema_command(
    which: Annotated[str, typer.Argument(help="plan (the plan JSON) or diff (the JSON of `diff --json`).")] = "plan",
) -> None:
    """Print the JSON Schema of the plan format (or of the diff JSON), for tools that read them."""
    if which not in SCHEMAS:
        fail(unknown_name("schema", which, SCHEMAS))
    from shardscope.plan.schema import shipped_schema  # lazy: off the --help path

    typer.echo(shipped_schema(*SCHEMAS[which]), nl=False)
