"""`shardscope verify MODEL --preset A [--against B|one-device]` (or `--step FILE.py:make_step`): real steps on
fake CPU devices under two shardings, compared tensor by tensor; exit 0 same, 1 diverged, 2 bad input."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shardscope.cli.app import (
    JsonOption,
    MaxTextOption,
    MaxTextPathOption,
    MeshOption,
    PresetOption,
    app,
    fail,
    quiet_compiler_logs,
)
from shardscope.cli.verify_options import check_options
from shardscope.errors import ShardscopeError
from shardscope.verify.records import AGAINST_ONE_DEVICE as ONE_DEVICE

if TYPE_CHECKING:
    from shardscope.verify.records import VerifyReport

DEFAULT_STEPS = 2


# The command's help: typer keeps a docstring's line breaks, so each paragraph is one string.
HELP = "\n\n".join(
    (
        "Run real training steps on fake CPU devices under two shardings (or one and a single device) and compare "
        "them: each step's loss, every gradient, every updated parameter and AdamW moment.",
        "Both sides start from the same parameters (the model initialised from a fixed key) and batches.",
        "Tolerance per tensor: 8 × eps × √K × max|reference|, eps of the coarsest float type it went through, K "
        "the summed sizes of the reductions on its way (read from each side's program); from step 2 also the "
        "relative difference the parameters already carry; AdamW's moments and updates bounded elementwise "
        "(the whole rule: docs/how-to/verify.md).",
        "A divergence is named with its error, its sharding on each side and the collectives of the preset's "
        "plan that touch it, with their model lines. Exit 0 same, 1 diverged, 2 bad input.",
        "maxtext:MODEL runs MaxText's own train step from MaxText's initial state and synthetic batch: --maxtext is "
        "its command line (reduce it: base_num_decoder_layers=2 base_emb_dim=…); --against one-device is the same "
        "command line with every ici_*_parallelism 1 on one device, --against 'k=v …' the command line with those "
        "keys changed.",
    )
)


@app.command("verify", help=HELP)
def verify_command(
    model: Annotated[
        str | None, typer.Argument(help="Model name, e.g. deepseek-tiny (see `shardscope list`); or use --step.")
    ] = None,
    preset: PresetOption = "default",
    against: Annotated[
        str,
        typer.Option(
            "--against",
            help="A second preset (name or YAML) to compare with, or one-device; for maxtext:MODEL, MaxText keys "
            "'k=v …' that change its command line.",
        ),
    ] = ONE_DEVICE,
    steps: Annotated[
        int | None, typer.Option("--steps", help=f"Training steps run on each side (default {DEFAULT_STEPS}).")
    ] = None,
    topology: Annotated[str, typer.Option("--topology", "-t", help="cpu-N (N fake CPU devices).")] = "cpu-8",
    mesh: MeshOption = None,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a setting on both sides: moe=ring, model.seq_len=64."),
    ] = None,
    step: Annotated[
        str | None,
        typer.Option("--step", help="Your own program, module:function returning (jitted step, args, mesh)."),
    ] = None,
    maxtext: MaxTextOption = None,
    maxtext_path: MaxTextPathOption = None,
    as_json: JsonOption = False,
) -> None:
    """Real steps under two shardings, compared: the same computation, or where it is not."""
    from shardscope.case.maxtext_model import is_maxtext_model  # lazy: off the --help path
    from shardscope.cli.case_options import check_maxtext_path

    count = DEFAULT_STEPS if steps is None else steps
    try:
        check_maxtext_path(model, maxtext_path)
        maxtext_model = model is not None and is_maxtext_model(model)
        check_options(model, step, preset, against, steps, mesh, settings, maxtext_model)
        quiet_compiler_logs()
        if model is None:
            report = _verify_step(step or "", topology)
        elif maxtext_model:
            report = _verify_maxtext(model, preset, against, count, topology, mesh, settings, maxtext, maxtext_path)
        else:
            report = _verify_model(model, preset, against, count, topology, mesh, settings, maxtext)
    except ShardscopeError as err:
        fail(err)
    if as_json:
        from shardscope.verify.records import report_to_json  # lazy: off the --help path

        typer.echo(report_to_json(report), nl=False)
    else:
        from shardscope.report.verify import verify_lines  # lazy: off the --help path

        typer.echo("\n".join(verify_lines(report)))
    raise typer.Exit(report.exit_code)


def _verify_model(
    model: str,
    preset: str,
    against: str,
    steps: int,
    topology: str,
    mesh: str | None,
    settings: list[str] | None,
    maxtext: str | None,
) -> VerifyReport:
    from shardscope.cli.case_options import resolve_cli_case  # lazy: off the --help path
    from shardscope.stages.devices import configure_devices

    case = resolve_cli_case(model, preset, topology, mesh, settings, maxtext)
    other = None if against == ONE_DEVICE else resolve_cli_case(model, against, topology, mesh, settings, maxtext)
    configure_devices(case.topology)
    from shardscope.verify.cases import verify_case  # lazy: loads JAX

    return verify_case(case, other, steps)


def _verify_maxtext(
    model: str,
    preset: str,
    against: str,
    steps: int,
    topology: str,
    mesh: str | None,
    settings: list[str] | None,
    maxtext: str | None,
    maxtext_path: Path | None,
) -> VerifyReport:
    from shardscope.cli.case_options import resolve_cli_maxtext_case  # lazy: off the --help path
    from shardscope.stages.devices import configure_devices

    case = resolve_cli_maxtext_case(model, topology, preset, mesh, settings, maxtext, maxtext_path)
    configure_devices(case.topology)
    from shardscope.verify.maxtext import verify_maxtext  # lazy: loads JAX and MaxText

    return verify_maxtext(case, None if against == ONE_DEVICE else against, steps)


def _verify_step(step: str, topology: str) -> VerifyReport:
    from shardscope.case.topology import get_topology  # lazy: off the --help path
    from shardscope.stages.devices import configure_devices
    from shardscope.stages.user_step import load_step_function, parse_step_ref

    ref = parse_step_ref(step)
    topo = get_topology(topology)
    configure_devices(topo)
    from shardscope.verify.steps import verify_step_function  # lazy: loads JAX

    return verify_step_function(load_step_function(ref), ref, topo)
