"""`shardscope dump MODEL --preset P`: one case planned (or `--step` a program of one's own); its summary with
what it costs, the plan JSON with `-o`, its tables with `--csv`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shardscope.cli.app import (
    EfficiencyOption,
    HardwareOption,
    JsonOption,
    MaxTextOption,
    MaxTextPathOption,
    MeshOption,
    NoCacheOption,
    OutputOption,
    PresetOption,
    SlicesOption,
    app,
    check_writable,
    fail,
    make_console,
    quiet_compiler_logs,
    write_output,
)
from shardscope.cli.case_options import (
    check_maxtext_path,
    check_model_or_step,
    resolve_cli_case,
    resolve_cli_maxtext_case,
)
from shardscope.errors import ShardscopeError

if TYPE_CHECKING:
    from shardscope.case.resolve import Case


PREDICTED_NOTE = (
    "note: collectives and work predicted from the placement, not compiled (weights, gradients, tensor-parallel"
    " and context activations, pipeline sends, MoE exchanges; the embedding's and router's reshards are not)"
)


@app.command("dump")
def dump_command(
    model: Annotated[
        str | None, typer.Argument(help="Model name, e.g. deepseek-tiny (see `shardscope list`); or use --step.")
    ] = None,
    preset: PresetOption = "default",
    topology: Annotated[str, typer.Option("--topology", "-t", help="cpu-N (N fake CPU devices).")] = "cpu-8",
    mesh: MeshOption = None,
    slices: SlicesOption = 1,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a setting: moe=ring, pipeline.microbatches=4, model.seq_len=64."),
    ] = None,
    output: OutputOption = None,
    csv: Annotated[
        Path | None, typer.Option("--csv", help="Also write tensors.csv and collectives.csv into this directory.")
    ] = None,
    as_json: JsonOption = False,
    maxtext: MaxTextOption = None,
    maxtext_path: MaxTextPathOption = None,
    tensors_only: Annotated[
        bool,
        typer.Option("--tensors-only", help="Every tensor's sharding from tracing and lowering alone (no compile)."),
    ] = False,
    predicted: Annotated[
        bool,
        typer.Option(
            "--predicted",
            help="Trace tensors only (as --tensors-only) and predict the collectives from the placement (no compile).",
        ),
    ] = False,
    no_cache: NoCacheOption = False,
    hardware: HardwareOption = None,
    efficiency: EfficiencyOption = None,
    step: Annotated[
        str | None,
        typer.Option(
            "--step",
            help="Your own program: module:function returning (jitted step, args, mesh); see docs/how-to/own-model.md.",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="The plan's name for --step (default: the function's).")
    ] = None,
) -> None:
    """Compile one case and print its plan summary with what it costs; write the plan JSON with -o."""
    # lazy: validation loads no JAX, so a wrong input fails in milliseconds; planning loads it afterwards
    from shardscope.case.maxtext_model import is_maxtext_model
    from shardscope.case.presets import absent_rule_axes
    from shardscope.case.topology import get_topology, with_slices
    from shardscope.cost.price import check_pricing, price_plan

    case = None
    maxtext_case = None
    try:
        topology = with_slices(topology, slices)
        check_model_or_step(model, step, preset, mesh, settings, tensors_only or predicted)
        check_maxtext_path(model, maxtext_path)
        if predicted and tensors_only:
            raise ShardscopeError("--predicted traces tensors only already and adds collectives: drop --tensors-only")
        if model is not None and is_maxtext_model(model):
            if predicted:
                raise ShardscopeError(f"--predicted reads the reference models' placement; {model} is compiled")
            maxtext_case = resolve_cli_maxtext_case(model, topology, preset, mesh, settings, maxtext, maxtext_path)
        elif model is not None:
            case = resolve_cli_case(model, preset, topology, mesh, settings, maxtext)
            print_unsized_mesh_note(case, preset)
        check_writable((output, "-o"), (None if csv is None else csv / "tensors.csv", "--csv"))
        if case is not None:
            check_pricing(case.topology.name, case.mesh, hardware, efficiency, case.dcn_axis)
        quiet_compiler_logs()
        from shardscope.golden.planning import plan_resolved_case  # lazy: a cache miss loads JAX
        from shardscope.stages.user_step import parse_step_ref

        if maxtext_case is not None:
            from shardscope.golden.pipeline import plan_maxtext_case  # lazy: loads JAX and MaxText

            planned = plan_maxtext_case(maxtext_case, tensors_only)
        elif case is None:
            from shardscope.golden.pipeline import plan_step_ref  # lazy: loads JAX

            planned = plan_step_ref(parse_step_ref(step or ""), get_topology(topology), name)
        else:
            planned = plan_resolved_case(case, tensors_only or predicted, use_cache=not no_cache)
        if predicted:
            from shardscope.predict import predicted_plan  # lazy: off the --help path

            planned = predicted_plan(planned)
        plan = price_plan(planned, hardware, efficiency)
    except ShardscopeError as err:
        fail(err)
    if csv is not None:
        from shardscope.atomic import write_atomic  # lazy: off the --help path

        write_atomic(csv / "tensors.csv", plan.tensors_frame().to_csv(index=False))
        write_atomic(csv / "collectives.csv", plan.collectives_frame().to_csv(index=False))
    if write_output(plan, output):
        return
    if as_json:
        from shardscope.plan.json import plan_to_json  # lazy: off the --help path

        typer.echo(plan_to_json(plan), nl=False)
        return
    from shardscope.report.terminal import plan_summary  # lazy: off the --help path

    console = make_console()
    console.print(plan_summary(plan))
    if predicted:
        console.print(PREDICTED_NOTE)
    absent = absent_rule_axes(case.preset) if case is not None else ()
    if absent:
        console.print(
            f"note: the rules name mesh axes that mesh_axes lacks ({', '.join(absent)}): size 1, as MaxText "
            "treats them, so they shard nothing"
        )
    for label, path in (("plan", output), ("tables", csv)):
        if path is not None:
            console.print(f"{label} written to {path}")


def print_unsized_mesh_note(case: Case, preset: str) -> str | None:
    """For a rule file without mesh sizes planned on MaxText's defaults, the one line (on standard error) saying
    which of its axes shard nothing and how to size them; returns it (None when there is nothing to say)."""
    from shardscope.lint.unsized_mesh import preset_label, unsized_mesh_note  # lazy: off the --help path

    note = unsized_mesh_note(case.preset, case.mesh, preset_label(preset, case.preset))
    if note is not None:
        typer.echo(f"note: {note}", err=True)
    return note
