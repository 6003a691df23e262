"""The numerics of golden cases that carry `verify:`: each case's real steps run against one device or against
another case, in this process after the plans are checked (`check`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardscope.case.maxtext_model import MaxTextCase
from shardscope.case.topology import get_topology
from shardscope.errors import ShardscopeError
from shardscope.golden.cases import ONE_DEVICE, GoldenCase, verified_against
from shardscope.golden.worker import StepCase, resolve_golden_case
from shardscope.stages.compiler_log import prepare_compiler_log
from shardscope.stages.devices import configure_cpu_devices
from shardscope.stages.user_step import load_step_function
from shardscope.verify.records import VerifyReport


@dataclass(frozen=True)
class Verification:
    """A golden case verified: its report, or the one-line reason it could not run."""

    case: GoldenCase
    report: VerifyReport | None
    error: str | None = None
    command: str = ""  # the `shardscope verify` command that runs it again


def verify_command(case: GoldenCase, other: GoldenCase | None) -> str:
    """The command line that verifies the case as `check` does."""
    if case.step:
        return f"shardscope verify --step {case.step} --topology {case.topology}"
    parts = ["shardscope verify", case.model, "--preset", case.preset, "--topology", case.topology]
    parts += ["--mesh", case.mesh] if case.mesh else []
    for setting in case.settings:
        parts += ["--set", setting]
    parts += ["--against", other.preset if other is not None else ONE_DEVICE]
    return " ".join(parts)


def verify_golden_case(case: GoldenCase, cases: Sequence[GoldenCase]) -> Verification:
    """Runs `case`'s steps against what its `verify:` names (the case of `cases` it names, or one device)."""
    # lazy: JAX loads only where something is verified
    from shardscope.verify.cases import verify_case
    from shardscope.verify.steps import verify_step_function

    try:
        other = verified_against(case, cases, case.case_id)
        command = verify_command(case, other)
        resolved = resolve_golden_case(case)
        if isinstance(resolved, StepCase):
            function = load_step_function(resolved.ref)
            report = verify_step_function(function, resolved.ref, resolved.topology)
            return Verification(case, report, command=command)
        against = resolve_golden_case(other) if other is not None else None
        if isinstance(against, StepCase):  # `verified_against` allows none: a step is no model's case
            raise ShardscopeError(f"{case.case_id}: verify: {other and other.case_id} is a step case")
        if isinstance(resolved, MaxTextCase) or isinstance(against, MaxTextCase):  # the manifest refuses them
            raise ShardscopeError(f"{case.case_id}: verify runs the reference models' steps, not MaxText's")
        return Verification(case, verify_case(resolved, against), command=command)
    except ShardscopeError as err:
        return Verification(case, None, str(err))


def verify_golden_cases(cases: Sequence[GoldenCase], whole_set: Sequence[GoldenCase]) -> list[Verification]:
    """Every case of `cases` that carries `verify:`, verified in this process (its device pool sized for the
    largest of their topologies, if JAX has not started yet)."""
    chosen = [case for case in cases if case.verify]
    if not chosen:
        return []
    prepare_compiler_log()
    configure_cpu_devices(max(get_topology(case.topology).num_devices for case in chosen))
    return [verify_golden_case(case, whole_set) for case in chosen]
