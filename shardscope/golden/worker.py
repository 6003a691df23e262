"""One golden case in one worker process (local or on a Ray actor): validated, planned, returned as plan JSON
or as the one-line reason it could not be planned."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shardscope.case.maxtext_model import MaxTextCase, resolve_maxtext_model
from shardscope.case.maxtext_run import parse_maxtext_args
from shardscope.case.resolve import Case, parse_overrides, resolve_case, resolve_maxtext_case
from shardscope.case.topology import Topology, get_topology, parse_mesh_arg
from shardscope.cost.price import check_pricing
from shardscope.errors import ShardscopeError
from shardscope.golden.cases import GoldenCase
from shardscope.golden.isolated import plan_in_child
from shardscope.interrupts import exit_on_interrupt
from shardscope.plan.json import plan_to_json
from shardscope.stages.compiler_log import prepare_compiler_log
from shardscope.stages.devices import configure_cpu_devices, quiet_libtpu
from shardscope.stages.user_step import StepRef, parse_step_ref

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event


@dataclass(frozen=True)
class DumpResult:
    """A case's plan as canonical JSON, or the one-line reason it could not be planned."""

    case: GoldenCase
    plan_json: str | None
    error: str | None = None
    cached: bool = False  # read from the plan cache, not compiled in this run


@dataclass(frozen=True)
class StepCase:
    """A golden case of one's own program, validated (its mesh is known only once its function runs)."""

    ref: StepRef
    topology: Topology


def resolve_golden_case(case: GoldenCase) -> Case | StepCase | MaxTextCase:
    """Validates a golden case like `dump` validates its arguments, pricing included (raises ShardscopeError)."""
    if case.is_maxtext:
        path = Path(case.maxtext_path) if case.maxtext_path else None
        topology = get_topology(case.topology)
        check_pricing(case.topology, (("devices", topology.num_devices),), case.hardware, case.efficiency)
        return resolve_maxtext_model(case.model, topology, parse_maxtext_args(case.maxtext), path)
    if case.step:
        step = StepCase(parse_step_ref(case.step), get_topology(case.topology))
        check_pricing(case.topology, (("devices", step.topology.num_devices),), case.hardware, case.efficiency)
        return step
    if case.maxtext:
        resolved, _ = resolve_maxtext_case(
            case.model, case.preset or None, case.topology, case.maxtext, parse_overrides(case.settings)
        )
    else:
        resolved = resolve_case(
            case.model, case.preset, case.topology, parse_mesh_arg(case.mesh), parse_overrides(case.settings)
        )
    check_pricing(resolved.topology.name, resolved.mesh, case.hardware, case.efficiency, resolved.dcn_axis)
    return resolved


def start_worker(devices: int) -> None:
    """Prepares a worker process (local or on a cluster) before its JAX starts: a CPU pool of `devices`,
    compiler logs captured, libtpu quiet, and an interrupt ending it silently (the parent says so)."""
    exit_on_interrupt(message=None)
    prepare_compiler_log()
    quiet_libtpu()
    configure_cpu_devices(devices)


def start_pool_worker(devices: int, started: Event) -> None:
    """Prepares a local pool's worker (`start_worker`), first setting `started`: this worker got past
    importing the caller's script, so a pool that breaks later did not break on that."""
    started.set()
    start_worker(devices)


def dump_one(case: GoldenCase) -> DumpResult:
    """Plans one case in this (prepared) worker: its plan JSON, or the one-line reason it failed."""
    from shardscope.golden.pipeline import plan_case, plan_step_ref  # lazy: JAX loads only where cases compile

    try:
        resolved = resolve_golden_case(case)
        if isinstance(resolved, MaxTextCase):
            return DumpResult(case, plan_in_child(resolved))
        if isinstance(resolved, StepCase):
            return DumpResult(case, plan_to_json(plan_step_ref(resolved.ref, resolved.topology, case.model)))
        return DumpResult(case, plan_to_json(plan_case(resolved)))
    except ShardscopeError as err:
        return DumpResult(case, None, str(err))
