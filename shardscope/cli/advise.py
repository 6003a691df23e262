"""`shardscope advise MODEL --topology T`: every mesh of the devices over each preset's axes, pruned
without compiling where it cannot work or cannot fit, the rest priced by prediction (no compile), the best
few compiled to confirm (locally or on a Ray cluster), and all ranked by estimated step time among the
plans that fit in HBM."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shardscope.cli.app import (
    EfficiencyOption,
    HardwareOption,
    JobsOption,
    JsonOption,
    MaxTextPathOption,
    NoCacheOption,
    RayOption,
    app,
    check_writable,
    compile_backend,
    fail,
    make_console,
)
from shardscope.errors import ShardscopeError

if TYPE_CHECKING:
    from shardscope.advise.advice import Advice

# Not from shardscope.advise.advice: --help must not load the library (the tests hold the two equal).
DEFAULT_CONFIRM, DEFAULT_MARGIN = 3, 0.1
CONFIRM_HELP = "Compile only this many best predicted plans (and any within --margin); 0: every one screened in."


@app.command("advise")
def advise_command(
    model: Annotated[str, typer.Argument(help="Model name, e.g. deepseek-tiny (see `shardscope list`).")],
    topology: Annotated[str, typer.Option("--topology", "-t", help="cpu-N or a TPU slice (v5p-128, …).")] = "cpu-8",
    presets: Annotated[
        list[str] | None, typer.Option("--preset", "-p", help="A preset to search (repeat; all built-ins if none).")
    ] = None,
    top: Annotated[int, typer.Option("--top", help="How many ranked plans to show.")] = 10,
    mesh: Annotated[
        str | None,
        typer.Option("--mesh", help="Hold these axes at these sizes (e.g. data=1,stage=1); the others are searched."),
    ] = None,
    settings: Annotated[list[str] | None, typer.Option("--set", help="Override a setting, as for dump.")] = None,
    maxtext: Annotated[
        str | None,
        typer.Option(
            "--maxtext",
            help="MaxText's command line ('k=v k=v …'): how every candidate runs; its ici_* sizes hold those axes "
            "and custom_mesh_and_rule the rules, the rest is searched.",
        ),
    ] = None,
    hardware: HardwareOption = None,
    efficiency: EfficiencyOption = None,
    as_json: JsonOption = False,
    csv: Annotated[Path | None, typer.Option("--csv", help="Write every compiled plan as CSV here.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write the ranking as one HTML page.")] = None,
    confirm: Annotated[int, typer.Option(help=CONFIRM_HELP)] = DEFAULT_CONFIRM,
    margin: Annotated[
        float, typer.Option(help="Also compile plans predicted within this fraction of #1.")
    ] = DEFAULT_MARGIN,
    predict_only: Annotated[bool, typer.Option(help="Rank by prediction alone: compile nothing.")] = False,
    jobs: JobsOption = 0,
    no_cache: NoCacheOption = False,
    ray: RayOption = None,
    maxtext_path: MaxTextPathOption = None,
) -> None:
    """Ranks the shardings of MODEL on a topology: fastest estimated step among the plans that fit in HBM.

    maxtext:MODEL searches MaxText's ici_*_parallelism sizes over its command line (--maxtext), every candidate
    compiled (no prediction of MaxText's program); an axis --maxtext sizes is held."""
    # lazy: off the --help path (no JAX)
    from shardscope.advise.sweep import advise, make_request
    from shardscope.case.maxtext_model import is_maxtext_model
    from shardscope.cli.advise_options import from_maxtext, maxtext_sweep
    from shardscope.cli.case_options import check_maxtext_path

    try:
        if top < 1:
            raise ShardscopeError(f"--top must be at least 1, found {top}")
        check_writable((csv, "--csv"), (html, "--html"))
        check_maxtext_path(model, maxtext_path)
        address, workers = compile_backend(ray, jobs)
        if is_maxtext_model(model):
            given: tuple[tuple[str, object], ...] = (
                ("--preset", presets),
                ("--mesh", mesh),
                ("--set", settings),
                ("--ray", ray),
                ("--confirm", confirm != DEFAULT_CONFIRM),
                ("--margin", margin != DEFAULT_MARGIN),
            )
            sweep = maxtext_sweep(model, topology, maxtext, maxtext_path, hardware, efficiency, given, predict_only)
            advice = _run(lambda tick: sweep(workers, not no_cache, tick))
        else:
            if maxtext is not None:
                topology, presets, mesh, settings = from_maxtext(model, topology, presets, mesh, settings, maxtext)
            request = make_request(model, topology, presets, mesh, settings, hardware, efficiency, confirm, margin)
            request = dataclasses.replace(request, predict_only=predict_only)
            advice = _run(lambda tick: advise(request, workers, not no_cache, address, tick))
    except ShardscopeError as err:
        fail(err)
    _write(advice, top, csv, html, as_json)


def _run(sweep: Callable[[Callable], Advice]) -> Advice:
    """The sweep, with progress: on a terminal a progress bar (plans done / to plan, and the best so far);
    piped, a line on stderr per tenth of the plans (a CI log shows the sweep is alive, in at most 10 lines)."""
    # lazy: rich loads only when a table is printed
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = make_console()
    if not console.is_terminal:
        return sweep(_piped_progress(time.monotonic()))
    from shardscope.report.advice import step_text  # lazy: off the --help path (no JAX)

    columns = (
        TextColumn("planning"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=None)

        def tick(state) -> None:
            best = f"best so far: {state.best.candidate.key} {step_text(state.best)}" if state.best else "none fits yet"
            progress.update(task, total=state.total, completed=state.done, description=best)

        return sweep(tick)


def _piped_progress(started: float) -> Callable:
    """The progress callback of a run without a terminal: each line to stderr as soon as it is due."""

    def tick(state) -> None:
        line = progress_line(state.done, state.total, time.monotonic() - started)
        if line is not None:
            typer.echo(line, err=True)  # flushed at once: a compile in this process captures stderr next

    return tick


def progress_line(done: int, total: int, seconds: float) -> str | None:
    """The line for `done` of `total` plans when it completes a tenth of them, else None: at most 10 lines,
    whatever the total, and one per plan when there are fewer than 10."""
    if total < 1 or done < 1 or 10 * done // total == 10 * (done - 1) // total:
        return None
    return f"advise: {100 * done // total}% ({done} of {total} plans done, {_elapsed(seconds)})"


def _elapsed(seconds: float) -> str:
    """ "42 s", "2 min 5 s", "1 h 12 min": as long as a sweep runs, to the unit that still matters."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _write(advice, top: int, csv: Path | None, html: Path | None, as_json: bool) -> None:
    from shardscope.atomic import write_atomic  # lazy: off the --help path (no JAX)

    if csv is not None:
        from shardscope.advise.export import advice_to_csv  # lazy: off the --help path (no JAX)

        write_atomic(csv, advice_to_csv(advice))
    if html is not None:
        from shardscope.report.advice import render_advice_html  # lazy: off the --help path (no JAX)

        write_atomic(html, render_advice_html(advice, top))
    if as_json:
        from shardscope.advise.export import advice_to_json  # lazy: off the --help path (no JAX)

        typer.echo(json.dumps(advice_to_json(advice), indent=2, sort_keys=True))
        return
    from shardscope.report.advice import advice_renderable  # lazy: off the --help path (no JAX)

    console = make_console()
    console.print(advice_renderable(advice, top))
    for path, what in ((csv, "CSV"), (html, "HTML")):
        if path is not None:
            console.print(f"{what} written to {path}")
