"""`shardscope diff OLD.json NEW.json`: two plans compared by meaning, with what the change costs per step;
an HTML report and a Markdown summary on request. Exit 0 when they place and move the same, 1 when they
differ (`--strict`: any difference, lint findings too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shardscope.cli.app import (
    EfficiencyOption,
    HardwareOption,
    HtmlOption,
    JsonOption,
    MarkdownOption,
    app,
    check_writable,
    fail,
    make_console,
)
from shardscope.errors import ShardscopeError


@app.command("diff")
def diff_command(
    old: Annotated[Path, typer.Argument(help="The plan before (JSON).")],
    new: Annotated[Path, typer.Argument(help="The plan after (JSON).")],
    html: HtmlOption = None,
    markdown: MarkdownOption = None,
    hardware: HardwareOption = None,
    efficiency: EfficiencyOption = None,
    as_json: JsonOption = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 on any difference, lint findings and the case header too.")
    ] = False,
) -> None:
    """Semantic diff of two plans, with what the change costs per step. Exit 0 when they place and move the
    same (lint findings and case names are reported, not counted, unless --strict), 1 when they differ."""
    # lazy: off the --help path
    from shardscope.atomic import write_atomic
    from shardscope.diff.json import diff_to_json
    from shardscope.diff.plans import diff_plans
    from shardscope.plan.json import load_plan
    from shardscope.report.diff_terminal import diff_renderable
    from shardscope.report.html import render_html_many
    from shardscope.report.markdown import render_markdown

    try:
        check_writable((html, "--html"), (markdown, "--markdown"))
        diff = diff_plans(load_plan(old), load_plan(new), hardware=hardware, efficiency=efficiency)
    except ShardscopeError as err:
        fail(err)
    if as_json:
        typer.echo(json.dumps(diff_to_json(diff), indent=2, sort_keys=True))
    else:
        make_console().print(diff_renderable(diff))
    if html is not None:
        write_atomic(html, render_html_many([diff]))
    if markdown is not None:
        write_atomic(markdown, render_markdown(diff))
    differs = not diff.same if strict else bool(diff.placement_changes)
    raise typer.Exit(1 if differs else 0)
