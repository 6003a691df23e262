"""`shardscope update [CASE…]`: goldens regenerated (all, or the named cases); every write is atomic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shardscope.cli.app import (
    GoldenOption,
    JobsOption,
    JsonOption,
    NoCacheOption,
    RayOption,
    app,
    check_writable,
    compile_backend,
    fail,
    make_console,
    run_with_progress,
)
from shardscope.errors import ShardscopeError


@app.command("update")
def update_command(
    cases_wanted: Annotated[list[str] | None, typer.Argument(metavar="[CASE]...", help="model/topology/name")] = None,
    golden: GoldenOption = Path("golden"),
    jobs: JobsOption = 0,
    no_cache: NoCacheOption = False,
    as_json: JsonOption = False,
    ray: RayOption = None,
) -> None:
    """Regenerate goldens (all, or the named cases); every write is atomic."""
    # lazy: off the --help path
    from shardscope.golden.cases import load_manifest, select_cases
    from shardscope.golden.check import outcome_to_json, update_goldens
    from shardscope.golden.store import golden_path, orphan_goldens
    from shardscope.report.check import outcome_table

    try:
        all_cases = load_manifest(golden)
        chosen = select_cases(all_cases, cases_wanted or [])
        # Every golden it would write, one per directory (the others there are written alike).
        goldens = {golden_path(golden, case).parent: golden_path(golden, case) for case in chosen}
        check_writable(*((path, "--golden") for path in goldens.values()))
        address, workers = compile_backend(ray, jobs)
        outcomes = run_with_progress(
            lambda tick: update_goldens(golden, chosen, workers, tick, not no_cache, address), chosen, "updating"
        )
    except ShardscopeError as err:
        fail(err)
    orphans = orphan_goldens(golden, all_cases)
    if as_json:
        data = {"cases": [outcome_to_json(o) for o in outcomes], "orphans": [str(p) for p in orphans]}
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        console = make_console()
        console.print(outcome_table(outcomes))
        for orphan in orphans:
            console.print(f"[yellow]orphaned golden (no case owns it):[/] {orphan}")
    if any(o.status == "error" for o in outcomes):
        raise typer.Exit(2)
