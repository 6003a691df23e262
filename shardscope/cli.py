"""The `shardscope` command line: the only module that prints. Heavy imports happen inside commands."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from shardscope.errors import ShardscopeError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="See where every tensor of a sharded JAX model lives and what the devices say to each other.",
)


def _print_version(value: bool) -> None:
    if value:
        from importlib import metadata

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


def write_output(plan, output: Path | None) -> bool:
    """Writes a plan's JSON to `output` (atomically); True when that was standard output, which then carries
    nothing else."""
    from shardscope.plan import plan_to_json

    if output is None:
        return False
    if str(output) == "-":
        typer.echo(plan_to_json(plan), nl=False)
        return True
    from shardscope.atomic import write_atomic

    write_atomic(output, plan_to_json(plan))
    return False


def fail(err: ShardscopeError) -> NoReturn:
    typer.echo(f"shardscope: error: {err}", err=True)
    raise typer.Exit(2)


def make_console():
    from rich.console import Console

    # The terminal's own width; tables fold long cells to fit it. Piped output (no terminal to measure) is
    # 200 columns, so that whole paths stay on one line for grep, unless COLUMNS says otherwise.
    console = Console(soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(soft_wrap=False, width=200)
    return console


def _quiet_compiler_logs() -> None:
    # XLA's C++ warnings (e.g. about rematerialisation) go straight to stderr: they are captured while
    # compiling (lints read them) and shown only to users who set TF_CPP_MIN_LOG_LEVEL themselves.
    from shardscope.compiler_log import prepare_compiler_log

    prepare_compiler_log()


@app.command("list")
def list_command(as_json: JsonOption = False) -> None:
    """Models, presets, topologies and hardware shardscope knows."""
    from rich.table import Table
    from rich.text import Text

    from reference_models import MODELS
    from shardscope.cost.hardware import known_hardware
    from shardscope.presets import builtin_preset_names, get_preset
    from shardscope.tpu import known_tpu_names, libtpu_version, parse_tpu_slice

    if as_json:
        data = {
            "models": {
                name: {
                    "family": cfg.family,
                    "layers": cfg.num_layers,
                    "dense_layers": cfg.first_dense_layers,
                    "experts": cfg.num_experts,
                    "experts_per_token": cfg.num_experts_per_token,
                    "embed": cfg.embed_dim,
                    "seq_len": cfg.seq_len,
                }
                for name, cfg in MODELS.items()
            },
            "presets": {
                name: {
                    "moe": (p := get_preset(name)).moe,
                    "shard_mode": p.shard_mode,
                    "mesh": dict(p.mesh),
                    "origin": p.origin,
                    "description": p.description,
                }
                for name in builtin_preset_names()
            },
            "topologies": {name: parse_tpu_slice(name).num_devices for name in known_tpu_names()},
            "libtpu": libtpu_version(),
            "hardware": known_hardware(),
        }
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return

    console = make_console()
    models = Table(title="Models", title_justify="left", show_edge=False)
    for column in ("name", "family", "layers", "experts (top-k)", "embed", "seq"):
        models.add_column(column)
    for name, cfg in MODELS.items():
        models.add_row(
            name,
            cfg.family,
            f"{cfg.num_layers} ({cfg.first_dense_layers} dense)",
            f"{cfg.num_experts} ({cfg.num_experts_per_token})",
            str(cfg.embed_dim),
            str(cfg.seq_len),
        )
    presets = Table(title="Presets", title_justify="left", show_edge=False)
    for column in ("name", "moe", "shard mode", "mesh", "rules from", "description"):
        presets.add_column(column, no_wrap=column != "description")
    for name in builtin_preset_names():
        preset = get_preset(name)
        mesh = ",".join(f"{a}={s}" for a, s in preset.mesh if s != 1)
        origin = preset.origin.split()[0] if preset.origin else "shardscope"
        presets.add_row(name, preset.moe, preset.shard_mode, mesh, origin, preset.description)
    topologies = Table(title="Topologies", title_justify="left", show_edge=False)
    topologies.add_column("name")
    topologies.add_column("devices")
    topologies.add_row("cpu-N", "N fake CPU devices (default cpu-8; e.g. cpu-256 for real model shapes)")
    installed = libtpu_version()
    for name in known_tpu_names():
        note = f"{parse_tpu_slice(name).num_devices} TPU devices"
        needs = Text(f"{note} (needs: pip install 'shardscope[tpu]')")  # Text: `[tpu]` is not markup
        topologies.add_row(name, note if installed else needs)
    hardware = Text(f"hardware (--hardware): {', '.join(known_hardware())}")
    console.print(models, "", presets, "", topologies, "", hardware)


@app.command("dump")
def dump_command(
    model: Annotated[
        str | None, typer.Argument(help="Model name, e.g. deepseek-tiny (see `shardscope list`); or use --step.")
    ] = None,
    preset: PresetOption = "default",
    topology: Annotated[str, typer.Option("--topology", "-t", help="cpu-N (N fake CPU devices).")] = "cpu-8",
    mesh: MeshOption = None,
    slices: Annotated[int, typer.Option("--slices", help="TPU slices joined over DCN (the data axis spans them).")] = 1,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a setting: moe=ring, pipeline.microbatches=4, model.seq_len=64."),
    ] = None,
    output: OutputOption = None,
    csv: Annotated[
        Path | None, typer.Option("--csv", help="Also write tensors.csv and collectives.csv into this directory.")
    ] = None,
    as_json: JsonOption = False,
    tensors_only: Annotated[
        bool,
        typer.Option("--tensors-only", help="Every tensor's sharding from tracing and lowering alone (no compile)."),
    ] = False,
    no_cache: NoCacheOption = False,
    hardware: HardwareOption = None,
    efficiency: EfficiencyOption = None,
    step: Annotated[
        str | None,
        typer.Option(
            "--step",
            help="Your own program: module:function returning (jitted step, args, mesh); see the README.",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="The plan's name for --step (default: the function's).")
    ] = None,
) -> None:
    """Compile one case and print its plan summary with what it costs; write the plan JSON with -o."""
    from shardscope.case import parse_overrides, resolve_case
    from shardscope.topology import parse_mesh_arg, with_slices

    case = None
    try:
        topology = with_slices(topology, slices)
        _check_model_or_step(model, step, preset, mesh, settings, tensors_only)
        if step is None:
            assert model is not None
            case = resolve_case(model, preset, topology, parse_mesh_arg(mesh or ""), parse_overrides(settings or []))
        from shardscope.atomic import check_writable

        if output is not None and str(output) != "-":
            check_writable(output, "-o")
        if csv is not None:
            check_writable(csv / "tensors.csv", "--csv")
        from shardscope.cost.price import check_pricing, price_plan

        if case is not None:
            check_pricing(case.topology.name, case.mesh, hardware, efficiency)
        from shardscope.api import plan_resolved_case
        from shardscope.report.terminal import plan_summary

        _quiet_compiler_logs()
        if step is not None:
            from shardscope.step import parse_step_ref, plan_step_ref
            from shardscope.topology import get_topology

            ref = parse_step_ref(step)
            plan = price_plan(plan_step_ref(ref, get_topology(topology), name), hardware, efficiency)
        else:
            assert case is not None
            plan = price_plan(plan_resolved_case(case, tensors_only, use_cache=not no_cache), hardware, efficiency)
    except ShardscopeError as err:
        fail(err)
    if csv is not None:
        from shardscope.atomic import write_atomic

        write_atomic(csv / "tensors.csv", plan.tensors_frame().to_csv(index=False))
        write_atomic(csv / "collectives.csv", plan.collectives_frame().to_csv(index=False))
    if write_output(plan, output):
        return
    if as_json:
        from shardscope.plan import plan_to_json

        typer.echo(plan_to_json(plan), nl=False)
        return
    console = make_console()
    console.print(plan_summary(plan))
    from shardscope.presets import absent_rule_axes

    absent = absent_rule_axes(case.preset) if case is not None else ()
    if absent:
        console.print(
            f"note: the rules name mesh axes that mesh_axes lacks ({', '.join(absent)}): size 1, as MaxText "
            "treats them, so they shard nothing"
        )
    for label, path in (("plan", output), ("tables", csv)):
        if path is not None:
            console.print(f"{label} written to {path}")


def _check_model_or_step(
    model: str | None,
    step: str | None,
    preset: str,
    mesh: str | None,
    settings: list[str] | None,
    tensors_only: bool,
) -> None:
    """A reference model or --step, never both; a step brings its own mesh and shardings."""
    if (model is None) == (step is None):
        raise ShardscopeError("dump needs a model name or --step module:function (one of them)")
    if step is not None:
        given = [
            option
            for option, value in (
                ("--preset", preset != "default"),
                ("--mesh", mesh),
                ("--set", settings),
                ("--tensors-only", tensors_only),
            )
            if value
        ]
        if given:
            raise ShardscopeError(f"--step brings its own mesh and shardings: {', '.join(given)} does not apply")


@app.command("explain")
def explain_command(
    axes: Annotated[list[str], typer.Argument(help="Logical axis names, one per dimension (None = unnamed).")],
    preset: PresetOption = "default",
    mesh: MeshOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {spec, dims} as JSON.")] = False,
) -> None:
    """Physical spec of a logical-axes tuple under a preset, and which rule decided each dimension."""
    from shardscope.explain import explain_axes
    from shardscope.presets import get_preset
    from shardscope.topology import parse_mesh_arg

    try:
        resolved = get_preset(preset)
        explanation = explain_axes(resolved, axes, parse_mesh_arg(mesh or ""))
    except ShardscopeError as err:
        fail(err)
    if as_json:
        typer.echo(json.dumps(explanation.to_json(), indent=2, sort_keys=True))
        return
    from shardscope.report.terminal import explain_renderable

    make_console().print(
        explain_renderable(explanation.logical, explanation.decisions, resolved.logical_axis_rules, explanation.notes)
    )


@app.command("collectives")
def collectives_command(
    hlo_file: Annotated[Path, typer.Argument(help="HLO text (Compiled.as_text(), or an --xla_dump_to *.txt).")],
    mesh: Annotated[
        str | None,
        typer.Option(
            "--mesh", help="The mesh in order, e.g. data=1,fsdp=4,expert=2; without it, device groups are shown."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """The collectives table of any HLO text file, in your mesh axes."""
    from shardscope.hlo import HloParseError, check_mesh, collectives_of, read_module

    try:
        try:
            data = hlo_file.read_bytes()
        except OSError as err:
            raise ShardscopeError(f"cannot read {hlo_file}: {err.strerror}") from None
        try:
            module = read_module(data)
        except HloParseError as err:
            raise ShardscopeError(f"{hlo_file}: {err}") from None
        layout = _collectives_mesh(mesh, module.num_devices) if mesh else None
        parsed = collectives_of(module, layout)
        if layout is not None:
            check_mesh(parsed, layout)
    except ShardscopeError as err:
        fail(err)
    from shardscope.collectives import collective_rows

    rows = collective_rows(parsed)
    if as_json:
        payload = {
            "collectives": [c.to_dict() for c in parsed.collectives],
            "unknown": [u.__dict__ for u in parsed.unknown],
            "notices": list(parsed.notices),
        }
        typer.echo(json.dumps(payload, indent=2, sort_keys=True))
        return
    from shardscope.report.terminal import collectives_table, traffic_tables

    console = make_console()
    console.print(collectives_table(rows), "", traffic_tables(rows))
    for unknown in parsed.unknown:
        console.print(f"[yellow]not understood:[/] {unknown.op} (line {unknown.line})")
    for notice in parsed.notices:
        typer.echo(f"shardscope: warning: {hlo_file}: {notice}", err=True)


def _collectives_mesh(text: str, num_devices: int | None):
    """The `--mesh` of `collectives` as a layout: each axis once, a -1 filled from the module's devices."""
    from shardscope.errors import MeshError
    from shardscope.hlo import MeshLayout
    from shardscope.topology import parse_mesh_arg

    sizes = parse_mesh_arg(text)
    names = [part.partition("=")[0].strip() for part in text.split(",") if part.strip()]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise MeshError(f"--mesh {text!r}: axis {repeated[0]!r} is given twice; name each mesh axis once")
    if not sizes:
        raise MeshError(f"--mesh {text!r}: expected axis=size pairs like 'fsdp=4,expert=2'")
    fill = [axis for axis, size in sizes.items() if size == -1]
    if fill:
        known = 1
        for size in sizes.values():
            known *= size if size > 0 else 1
        if len(fill) > 1 or num_devices is None or num_devices % known:
            why = (
                "only one axis may be -1"
                if len(fill) > 1
                else "the module does not say how many devices it runs on; give every size"
                if num_devices is None
                else f"the module runs on {num_devices} devices, which the other axes ({known}) do not divide"
            )
            raise MeshError(f"--mesh {text!r}: cannot fill {fill[0]!r} (-1): {why}")
        sizes[fill[0]] = num_devices // known
    return MeshLayout(tuple(sizes), tuple(sizes.values()))


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
ShardOption = Annotated[
    str | None,
    typer.Option("--shard", metavar="K/N", help="Check only shard K of N of the golden set (1/3, 2/3, 3/3)."),
]


def _compile_backend(ray: str | None, jobs: int) -> tuple[str | None, int]:
    """(the Ray cluster to compile on or None, workers): a cluster named by --ray or $RAY_ADDRESS is checked
    for an answer before anything else; its workers default to one per CPU of the cluster (0)."""
    from shardscope.ray_pool import check_reachable, ray_address
    from shardscope.runner import default_jobs

    address = ray_address(ray)
    if address is None:
        return None, jobs or default_jobs()
    check_reachable(address)
    return address, jobs


def _write_reports(diffs, html: Path | None, markdown: Path | None) -> None:
    """The diff command's reports: one HTML page, and the Markdown of each diff."""
    from shardscope.atomic import write_atomic
    from shardscope.report.html import render_html_many
    from shardscope.report.markdown import render_markdown

    if html is not None:
        write_atomic(html, render_html_many(diffs))
    if markdown is not None:
        write_atomic(markdown, "\n".join(render_markdown(d) for d in diffs))


@app.command("diff")
def diff_command(
    old: Annotated[Path, typer.Argument(help="The plan before (JSON).")],
    new: Annotated[Path, typer.Argument(help="The plan after (JSON).")],
    html: HtmlOption = None,
    markdown: MarkdownOption = None,
    hardware: HardwareOption = None,
    efficiency: EfficiencyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Semantic diff of two plans, with what the change costs per step. Exit 0 when they mean the same,
    1 when they differ."""
    from shardscope.diff import diff_plans
    from shardscope.plan import load_plan
    from shardscope.report.diff_terminal import diff_renderable

    try:
        for report in (html, markdown):
            if report is not None:
                from shardscope.atomic import check_writable

                check_writable(report, "report")
        diff = diff_plans(load_plan(old), load_plan(new), hardware=hardware, efficiency=efficiency)
    except ShardscopeError as err:
        fail(err)
    if as_json:
        from shardscope.diff import diff_to_json

        typer.echo(json.dumps(diff_to_json(diff), indent=2, sort_keys=True))
    else:
        make_console().print(diff_renderable(diff))
    _write_reports([diff], html, markdown)
    raise typer.Exit(0 if diff.same else 1)


def _run_with_progress(run, cases, label: str):
    """Runs `run(tick)`, showing "label i/N elapsed" on a terminal; quiet when output is not a terminal."""
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
    from rich.text import Text

    from shardscope.check import check_goldens, check_summary
    from shardscope.golden import load_manifest, parse_shard, shard_cases
    from shardscope.report.diff_terminal import diff_renderable

    try:
        index, count = parse_shard(shard) if shard is not None else (1, 1)
        whole = load_manifest(golden)
        cases = shard_cases(whole, index, count)
        for report in (html, markdown):
            if report is not None:
                from shardscope.atomic import check_writable

                check_writable(report, "report")
        address, workers = _compile_backend(ray, jobs)
        outcomes = _run_with_progress(
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
        from shardscope.check import outcome_to_json

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
        console.print(_outcome_table(outcomes))
        console.print(Text(summary.line, "bold red" if summary.failed(require_all) else "bold green"))
        for hint in summary.hints:
            console.print(Text(hint))
    if html is not None:
        from shardscope.atomic import write_atomic
        from shardscope.check import outcome_diff
        from shardscope.report.html import render_html_many

        changed = [o.diff for o in outcomes if o.status == "changed" and o.diff is not None]
        # With nothing changed the report still says so, case by case.
        same = [d for o in outcomes if o.status == "same" and (d := outcome_diff(o)) is not None]
        write_atomic(html, render_html_many(changed or same))
    if markdown is not None:
        from shardscope.atomic import write_atomic
        from shardscope.report.markdown import render_check_markdown

        write_atomic(markdown, render_check_markdown(outcomes, summary))
    if any(o.status == "error" for o in outcomes):
        raise typer.Exit(2)
    raise typer.Exit(1 if summary.failed(require_all) else 0)


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
    from shardscope.check import update_goldens
    from shardscope.golden import load_manifest, orphan_goldens, select_cases

    try:
        all_cases = load_manifest(golden)
        chosen = select_cases(all_cases, cases_wanted or [])
        address, workers = _compile_backend(ray, jobs)
        outcomes = _run_with_progress(
            lambda tick: update_goldens(golden, chosen, workers, tick, not no_cache, address), chosen, "updating"
        )
    except ShardscopeError as err:
        fail(err)
    orphans = orphan_goldens(golden, all_cases)
    if as_json:
        from shardscope.check import outcome_to_json

        data = {"cases": [outcome_to_json(o) for o in outcomes], "orphans": [str(p) for p in orphans]}
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        console = make_console()
        console.print(_outcome_table(outcomes))
        for orphan in orphans:
            console.print(f"[yellow]orphaned golden (no case owns it):[/] {orphan}")
    if any(o.status == "error" for o in outcomes):
        raise typer.Exit(2)


def _outcome_table(outcomes):
    from rich.table import Table
    from rich.text import Text

    styles = {"same": "green", "unchanged": "green", "created": "cyan", "updated": "cyan"}
    table = Table(show_edge=False)
    for column in ("case", "status", "detail"):
        table.add_column(column)
    for outcome in outcomes:
        detail = outcome.message
        if outcome.diff is not None and not outcome.diff.same:
            kinds: dict[str, int] = {}
            for change in outcome.diff.changes:
                kinds[change.kind] = kinds.get(change.kind, 0) + 1
            detail = ", ".join(f"{count} {kind.replace('_', ' ')}" for kind, count in sorted(kinds.items()))
        style = styles.get(outcome.status, "yellow" if outcome.status == "skipped" else "red")
        # Text, not markup: a detail like "pip install 'shardscope[tpu]'" must print as written.
        table.add_row(Text(outcome.case_id), Text(outcome.status, style), Text(detail))
    return table


def main() -> None:
    """Console-script entry point: a usage mistake (an unknown option, a missing argument) is one line and
    exit 2, like every other wrong input."""
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


# The commands defined in their own modules register themselves on `app` when imported.
from shardscope.commands import advise as _advise  # noqa: E402,F401
from shardscope.commands import compare as _compare  # noqa: E402,F401
from shardscope.commands import lint as _lint  # noqa: E402,F401
from shardscope.commands import maxtext as _maxtext  # noqa: E402,F401
from shardscope.commands import table as _table  # noqa: E402,F401

if __name__ == "__main__":
    # Run as `python -m shardscope.cli`: the command modules registered themselves on the app of the module
    # they imported (`shardscope.cli`), which is not this `__main__` copy.
    from shardscope.cli import main as _main

    _main()
