"""`verify MODEL --preset A --against B|one-device`: a reference model's train step run for real under two
shardings (or one sharding and one device) from the same parameters and batches, and compared."""

from __future__ import annotations

import dataclasses

import jax

from shardscope.case.resolve import Case
from shardscope.case.topology import Topology, mesh_label
from shardscope.errors import ShardscopeError
from shardscope.plan.document import Plan
from shardscope.stages.train_step import ADAMW
from shardscope.verify.compare import compare_runs
from shardscope.verify.inputs import check_small_enough, starting_point
from shardscope.verify.layout import stacked_config
from shardscope.verify.records import VerifyReport
from shardscope.verify.run import SideRun, run_case, run_one_device
from shardscope.verify.verdict import build_report

DEFAULT_STEPS = 2


def side_label(case: Case) -> str:
    """`default on fsdp=4,expert=2`: a side's preset and the mesh axes that split its devices."""
    return f"{case.preset.name} on {mesh_label(tuple((axis, size) for axis, size in case.mesh if size > 1))}"


def check_runs_here(steps: int, topology: Topology) -> None:
    """Refuses a verification of no steps, or on a TPU topology (real steps run on fake CPU devices).

    Raises:
      ShardscopeError: either, saying what to give instead.
    """
    if steps < 1:
        raise ShardscopeError(f"--steps {steps}: verify runs at least one step")
    if topology.platform != "cpu":
        raise ShardscopeError(
            f"verify runs real steps on fake CPU devices: use --topology cpu-{topology.num_devices} rather than "
            f"{topology.name}"
        )


def check_verifiable(case: Case, against: Case | None, steps: int) -> None:
    """Refuses what cannot be verified: no steps, a TPU topology, a model too large to run, two presets that
    make different models or batches (the same step must run on both sides).

    Raises:
      ShardscopeError: any of those, saying what differs.
    """
    check_runs_here(steps, case.topology)
    check_small_enough(case)
    if against is None:
        return
    if case.global_batch != against.global_batch:
        raise ShardscopeError(
            f"{case.preset.name} and {against.preset.name} train on different batches ({case.global_batch} vs "
            f"{against.global_batch} sequences: the batch is per device × devices); give both the same with "
            "--set model.global_batch=N"
        )
    mine, theirs = stacked_config(case.model), stacked_config(against.model)
    if mine != theirs:
        fields = [f.name for f in dataclasses.fields(mine) if getattr(mine, f.name) != getattr(theirs, f.name)]
        raise ShardscopeError(
            f"{case.preset.name} and {against.preset.name} make different {case.model_name} models "
            f"({', '.join(f'{name}: {getattr(mine, name)} vs {getattr(theirs, name)}' for name in fields)}); "
            "verify compares the same step under two shardings"
        )


def verify_case(case: Case, against: Case | None, steps: int = DEFAULT_STEPS) -> VerifyReport:
    """Runs `steps` real train steps of `case` and of `against` (None: the same step on one device) from the
    same parameters and batches, and compares their losses, gradients, parameters and optimizer moments.

    Raises:
      ShardscopeError: what `check_verifiable` refuses, or a mesh this process has too few devices for.
    """
    check_verifiable(case, against, steps)
    start = starting_point(case.model, case.global_batch, steps)
    side = run_case(case, start, side_label(case))
    if against is None:
        reference = run_one_device(case, start, min(jax.devices(), key=lambda d: d.id))
    else:
        reference = run_case(against, start, side_label(against), compare_in=case)
    checks = compare_runs(side, reference, ADAMW)
    return build_report(case.model_name, case.topology.name, side, reference, checks, _plan_of)


def _plan_of(run: SideRun) -> Plan | None:
    """A preset side's plan, extracted from the very program that ran (one compile serves both)."""
    from shardscope.extract.plans import extract_plan  # lazy: only a divergence needs the plan

    step = run.compiled_case
    if step is None:
        return None
    return extract_plan(step, step.compiled.as_text())
