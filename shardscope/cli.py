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
    help="See where every tensor of a sharded JAX model lives and what the devices say to each other.",
)

MeshOption = Annotated[
    str | None, typer.Option("--mesh", help="Mesh axis sizes, e.g. fsdp=4,expert=2 (-1 fills the remaining devices).")
]
PresetOption = Annotated[str, typer.Option("--preset", "-p", help="Built-in preset name or path to a preset YAML.")]


def _fail(err: ShardscopeError) -> NoReturn:
    typer.echo(f"shardscope: error: {err}", err=True)
    raise typer.Exit(2)


def _console():
    from rich.console import Console

    # Plans have long paths: never narrower than 160 columns, even when piped.
    return Console(soft_wrap=False, width=max(160, Console().width))


def _quiet_compiler_logs() -> None:
    # XLA's C++ warnings (e.g. about rematerialisation) go straight to stderr; users who want them can set
    # TF_CPP_MIN_LOG_LEVEL=0 themselves.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@app.command("list")
def list_command() -> None:
    """Models, presets and topologies shardscope knows."""
    from rich.table import Table

    from reference_models import MODELS
    from shardscope.presets import builtin_preset_names, get_preset

    console = _console()
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
    from shardscope.tpu import known_tpu_names, libtpu_version, parse_tpu_slice

    installed = libtpu_version()
    for name in known_tpu_names():
        note = f"{parse_tpu_slice(name).num_devices} TPU devices"
        topologies.add_row(name, note if installed else f"{note} (needs: pip install 'shardscope[tpu]')")
    console.print(models, "", presets, "", topologies)


@app.command("dump")
def dump_command(
    model: Annotated[str, typer.Argument(help="Model name, e.g. deepseek-tiny (see `shardscope list`).")],
    preset: PresetOption = "default",
    topology: Annotated[str, typer.Option("--topology", "-t", help="cpu-N (N fake CPU devices).")] = "cpu-8",
    mesh: MeshOption = None,
    slices: Annotated[int, typer.Option("--slices", help="TPU slices joined over DCN (the data axis spans them).")] = 1,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a setting: moe=ring, pipeline.microbatches=4, model.seq_len=64."),
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the plan JSON here.")] = None,
    tensors_only: Annotated[
        bool,
        typer.Option("--tensors-only", help="Every tensor's sharding from tracing and lowering alone (no compile)."),
    ] = False,
) -> None:
    """Compile one case and print its plan summary; write the plan JSON with -o."""
    from shardscope.case import parse_overrides, resolve_case
    from shardscope.topology import parse_mesh_arg, with_slices

    try:
        topology = with_slices(topology, slices)
        case = resolve_case(model, preset, topology, parse_mesh_arg(mesh or ""), parse_overrides(settings or []))
        _quiet_compiler_logs()
        from shardscope.topology import configure_devices

        configure_devices(case.topology)
        from shardscope.atomic import write_atomic
        from shardscope.extract import plan_case
        from shardscope.plan import plan_to_json
        from shardscope.report.terminal import plan_summary

        plan = plan_case(case, tensors_only=tensors_only)
    except ShardscopeError as err:
        _fail(err)
    console = _console()
    console.print(plan_summary(plan))
    from shardscope.presets import absent_rule_axes

    absent = absent_rule_axes(case.preset)
    if absent:
        console.print(
            f"note: the rules name mesh axes that mesh_axes lacks ({', '.join(absent)}): size 1, as MaxText "
            "treats them, so they shard nothing"
        )
    if output is not None:
        write_atomic(output, plan_to_json(plan))
        console.print(f"plan written to {output}")


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
        _fail(err)
    if as_json:
        typer.echo(json.dumps(explanation.to_json(), indent=2, sort_keys=True))
        return
    from shardscope.report.terminal import explain_renderable

    _console().print(
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
        _fail(err)
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

    console = _console()
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


def _write_reports(diffs, html: Path | None, markdown: Path | None) -> None:
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
) -> None:
    """Semantic diff of two plans. Exit 0 when they mean the same, 1 when they differ."""
    from shardscope.diff import diff_plans
    from shardscope.golden import load_golden
    from shardscope.report.diff_terminal import diff_renderable

    try:
        diff = diff_plans(load_golden(old), load_golden(new))
    except ShardscopeError as err:
        _fail(err)
    _console().print(diff_renderable(diff))
    _write_reports([diff], html, markdown)
    raise typer.Exit(0 if diff.same else 1)


def _run_with_progress(run, cases, label: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=_console(), transient=True
    ) as progress:
        task = progress.add_task(label, total=len(cases))
        return run(lambda result: progress.advance(task))


@app.command("check")
def check_command(
    golden: GoldenOption = Path("golden"),
    html: HtmlOption = None,
    markdown: MarkdownOption = None,
    jobs: JobsOption = 0,
) -> None:
    """Re-dump every golden case and diff it. Exit 0 all same, 1 any changed/missing/orphaned, 2 bad input."""
    from shardscope.check import check_goldens
    from shardscope.golden import load_manifest
    from shardscope.report.diff_terminal import diff_renderable
    from shardscope.runner import default_jobs

    try:
        cases = load_manifest(golden)
        outcomes = _run_with_progress(
            lambda tick: check_goldens(golden, cases, jobs or default_jobs(), tick), cases, "checking"
        )
    except ShardscopeError as err:
        _fail(err)
    console = _console()
    changed = [o.diff for o in outcomes if o.status == "changed" and o.diff is not None]
    # With nothing changed the report still says so, case by case.
    reported = changed or [o.diff for o in outcomes if o.diff is not None]
    for outcome in outcomes:
        if outcome.status == "changed" and outcome.diff is not None:
            console.print(f"[bold]{outcome.case_id}[/] changed:")
            console.print(diff_renderable(outcome.diff))
    console.print(_outcome_table(outcomes))
    if reported:
        _write_reports(reported, html, markdown)
    if any(o.status == "error" for o in outcomes):
        raise typer.Exit(2)
    raise typer.Exit(0 if all(o.status == "same" for o in outcomes) else 1)


@app.command("update")
def update_command(
    cases_wanted: Annotated[list[str] | None, typer.Argument(metavar="[CASE]...", help="model/topology/name")] = None,
    golden: GoldenOption = Path("golden"),
    jobs: JobsOption = 0,
) -> None:
    """Regenerate goldens (all, or the named cases); every write is atomic."""
    from shardscope.check import update_goldens
    from shardscope.golden import load_manifest, orphan_goldens, select_cases
    from shardscope.runner import default_jobs

    try:
        all_cases = load_manifest(golden)
        chosen = select_cases(all_cases, cases_wanted or [])
        outcomes = _run_with_progress(
            lambda tick: update_goldens(golden, chosen, jobs or default_jobs(), tick), chosen, "updating"
        )
    except ShardscopeError as err:
        _fail(err)
    console = _console()
    console.print(_outcome_table(outcomes))
    for orphan in orphan_goldens(golden, all_cases):
        console.print(f"[yellow]orphaned golden (no case owns it):[/] {orphan}")
    if any(o.status == "error" for o in outcomes):
        raise typer.Exit(2)


def _outcome_table(outcomes):
    from rich.table import Table

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
        style = styles.get(outcome.status, "red")
        table.add_row(outcome.case_id, f"[{style}]{outcome.status}[/]", detail)
    return table


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
