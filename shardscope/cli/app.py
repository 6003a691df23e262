"""The typer app and what every command shares: its options, the console, one-line errors (exit 2), writing
a plan, progress on a terminal. The only package that prints; heavy imports happen inside commands (lazy,
so that `--help` never starts JAX)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from shardscope.errors import ShardscopeError

if TYPE_CHECKING:
    from rich.console import Console

    from shardscope.plan.document import Plan

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="See where every tensor of a sharded JAX model lives and what the devices say to each other.",
)


def _print_version(value: bool) -> None:
    if value:
        from importlib import metadata  # lazy: off the --help path (no JAX)

        typer.echo(f"shardscope {metadata.version('shardscope')}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """See where every tensor of a sharded JAX model lives and what the devices say to each other."""


MeshOption = Annotated[
    str | None, typer.Option("--mesh", help="Mesh axis sizes, e.g. fsdp=4,expert=2 (-1 fills the remaining devices).")
]
PresetOption = Annotated[str, typer.Option("--preset", "-p", help="Built-in preset name or path to a preset YAML.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON instead of tables.")]
OutputOption = Annotated[
    Path | None, typer.Option("--output", "-o", help="Write the plan JSON here (- for standard output).")
]
HardwareOption = Annotated[
    str | None,
    typer.Option(
        "--hardware",
        help="Price the plan on a TPU generation (v4, v5e, v5p, v6e, tpu7x); TPU topologies price as themselves.",
    ),
]
EfficiencyOption = Annotated[
    float | None,
    typer.Option("--efficiency", help="Fraction of link bandwidth collectives reach (default: the hardware table's)."),
]
HtmlOption = Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report here.")]
MarkdownOption = Annotated[Path | None, typer.Option("--markdown", help="Write a Markdown summary (for a PR comment).")]
GoldenOption = Annotated[Path, typer.Option("--golden", help="Golden directory (with cases.yaml).")]
JobsOption = Annotated[int, typer.Option("--jobs", "-j", help="Worker processes (default: one per core).")]
NoCacheOption = Annotated[
    bool, typer.Option("--no-cache", help="Compile every case, even those whose inputs are all unchanged.")
]
RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS",
        help="Compile on the Ray cluster at ADDRESS (host:port or ray://host:port; default: $RAY_ADDRESS).",
    ),
]
MaxTextOption = Annotated[
    str | None,
    typer.Option(
        "--maxtext",
        help="MaxText's own command-line keys, 'k=v k=v …' (per_device_batch_size, ici_fsdp_parallelism, "
        "custom_mesh_and_rule, remat_policy, compile_topology, …); MaxText's defaults size the rest of the mesh.",
    ),
]
MaxTextPathOption = Annotated[
    Path | None,
    typer.Option(
        "--maxtext-path",
        help="A MaxText checkout (its root or src/) to plan maxtext:MODEL from, instead of the installed package.",
    ),
]
SlicesOption = Annotated[int, typer.Option("--slices", help="TPU slices joined over DCN (the data axis spans them).")]


def fail(err: ShardscopeError) -> NoReturn:
    """A wrong input: one line on stderr, exit 2."""
    typer.echo(f"shardscope: error: {err}", err=True)
    raise typer.Exit(2)


def make_console() -> Console:
    """A console the width of the terminal; piped output (no terminal to measure) is 120 columns unless
    COLUMNS says otherwise (tables elide long paths in the middle rather than break them)."""
    from rich.console import Console  # lazy: rich loads only for commands that print tables

    console = Console(soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(soft_wrap=False, width=120)
    return console


def check_writable(*targets: tuple[Path | None, str]) -> None:
    """Fails before any work when an output cannot be written (`-` is standard output)."""
    from shardscope.atomic import check_writable as check  # lazy: off the --help path

    for path, what in targets:
        if path is not None and str(path) != "-":
            check(path, what)


def write_output(plan: Plan, output: Path | None) -> bool:
    """Writes a plan's JSON to `output` (atomically); True when that was standard output, which then carries
    nothing else."""
    from shardscope.atomic import write_atomic  # lazy: off the --help path
    from shardscope.plan.json import plan_to_json

    if output is None:
        return False
    if str(output) == "-":
        typer.echo(plan_to_json(plan), nl=False)
        return True
    write_atomic(output, plan_to_json(plan))
    return False


def quiet_compiler_logs() -> None:
    """XLA's C++ warnings (e.g. about rematerialisation) go straight to stderr: they are captured while
    compiling (lints read them) and shown only to users who set TF_CPP_MIN_LOG_LEVEL themselves."""
    from shardscope.stages.compiler_log import prepare_compiler_log  # lazy: before JAX, off the --help path

    prepare_compiler_log()


def compile_backend(ray: str | None, jobs: int) -> tuple[str | None, int]:
    """(the Ray cluster to compile on or None, workers): a cluster named by --ray or $RAY_ADDRESS is checked
    for an answer before anything else; its workers default to one per CPU of the cluster (0)."""
    from shardscope.golden.ray_pool import check_reachable, ray_address  # lazy: off the --help path
    from shardscope.golden.runner import default_jobs

    address = ray_address(ray)
    if address is None:
        return None, jobs or default_jobs()
    check_reachable(address)
    return address, jobs


Result = TypeVar("Result")


def run_with_progress(run: Callable[[Callable[[Any], None]], Result], cases: Sequence[Any], label: str) -> Result:
    """Runs `run(tick)`, showing "label i/N elapsed" on a terminal; quiet when output is not a terminal."""
    # lazy: rich loads only when a table is printed
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = make_console()
    if not console.is_terminal:
        return run(lambda result: None)
    columns = (
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=len(cases))
        return run(lambda result: progress.update(task, advance=1, description=result.case.case_id))
