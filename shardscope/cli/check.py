"""`shardscope check`: every golden case re-dumped and diffed. Exit 0 all same, 1 any changed, missing or
orphaned, 2 a wrong input (or a case that could not be planned)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shardscope.cli.app import (
    GoldenOption,
    HtmlOption,
    JobsOption,
    JsonOption,
    MarkdownOption,
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

ShardOption = Annotated[
    str | None,
    typer.Option("--shard", metavar="K/N", help="Check only shard K of N of the golden set (1/3, 2/3, 3/3)."),
]


@app.command("check")
def check_command(
    golden: GoldenOption = Path("golden"),
    html: HtmlOption = None,
    markdown: MarkdownOption = None,
    jobs: JobsOption = 0,
    require_all: Annotated[
        bool,
        typer.Option("--require-all", help="Fail when a case cannot be checked here (a TPU case without libtpu)."),
    ] = False,
    no_cache: NoCacheOption = False,
    as_json: JsonOption = False,
    shard: ShardOption = None,
    ray: RayOption = None,
) -> None:
    """Re-dump every golden case and diff it. Exit 0 all same, 1 any changed/missing/orphaned, 2 bad input."""
    # lazy: off the --help path
    from rich.text import Text

    from shardscope.atomic import write_atomic
    from shardscope.golden.cases import load_manifest, parse_shard, shard_cases
    from shardscope.golden.check import check_goldens, check_summary, outcome_to_json, report_diffs
    from shardscope.report.check import outcome_table
    from shardscope.report.diff_terminal import diff_renderable
    from shardscope.report.html import render_html_many
    from shardscope.report.markdown import render_check_markdown

    try:
        index, count = parse_shard(shard) if shard is not None else (1, 1)
        whole = load_manifest(golden)
        cases = shard_cases(whole, index, count)
        check_writable((html, "--html"), (markdown, "--markdown"))
        address, workers = compile_backend(ray, jobs)
        outcomes = run_with_progress(
            lambda tick: check_goldens(
                golden, cases, workers, tick, not no_cache, address, whole_set=whole, report_orphans=index == 1
            ),
            cases,
            "checking",
        )
    except ShardscopeError as err:
        fail(err)
    summary = check_summary(outcomes, golden)
    if as_json:
        data = {
            "summary": summary.line,
            "failed": summary.failed(require_all),
            "hints": list(summary.hints),
            "cases": [outcome_to_json(o) for o in outcomes],
        }
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        console = make_console()
        for outcome in outcomes:
            if outcome.status == "changed" and outcome.diff is not None:
                console.print(f"[bold]{outcome.case_id}[/] changed:")
                console.print(diff_renderable(outcome.diff))
        console.print(outcome_table(outcomes))
        console.print(Text(summary.line, "bold red" if summary.failed(require_all) else "bold green"))
        for hint in summary.hints:
            console.print(Text(hint), soft_wrap=True)  # a command to copy stays on one line
    if html is not None:
        write_atomic(html, render_html_many(report_diffs(outcomes)))
    if markdown is not None:
        write_atomic(markdown, render_check_markdown(outcomes, summary))
    if any(o.status == "error" for o in outcomes):
        raise typer.Exit(2)
    raise typer.Exit(1 if summary.failed(require_all) else 0)
