"""The numerics of golden cases that carry `verify:`: each case's real steps run against one device or against
another case, after the plans are checked (`check`): in this process, or for MaxText's own program
(`maxtext:NAME`) in a child process on the case's own devices (`golden.isolated`)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from shardscope.case.maxtext_model import MaxTextCase
from shardscope.case.topology import get_topology
from shardscope.errors import ShardscopeError
from shardscope.golden.cases import ONE_DEVICE, GoldenCase, verified_against
from shardscope.golden.isolated import verify_in_child
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
    if case.is_maxtext:
        parts = ["shardscope verify", case.model, "--topology", case.topology, "--maxtext", shlex.quote(case.maxtext)]
        parts += ["--maxtext-path", shlex.quote(case.maxtext_path)] if case.maxtext_path else []
        return " ".join([*parts, "--against", shlex.quote(maxtext_against(other))])
    parts = ["shardscope verify", case.model, "--preset", case.preset, "--topology", case.topology]
    parts += ["--mesh", case.mesh] if case.mesh else []
    for setting in case.settings:
        parts += ["--set", setting]
    parts += ["--against", other.preset if other is not None else ONE_DEVICE]
    return " ".join(parts)


def maxtext_against(other: GoldenCase | None) -> str:
    """What a `maxtext:` case verifies against, as `verify --against` takes it: one-device, or the other case's
    whole command line laid over the case's (`verified_against` made sure that this is the other case)."""
    return ONE_DEVICE if other is None else other.maxtext


def verify_golden_case(case: GoldenCase, cases: Sequence[GoldenCase]) -> Verification:
    """Runs `case`'s steps against what its `verify:` names (the case of `cases` it names, or one device)."""
    # lazy: JAX loads only where something is verified
    from shardscope.verify.cases import verify_case
    from shardscope.verify.steps import verify_step_function

    try:
        other = verified_against(case, cases, case.case_id)
        command = verify_command(case, other)
        resolved = resolve_golden_case(case)
        if isinstance(resolved, MaxTextCase):
            # MaxText sizes its batch by the process's devices: it runs on the case's own, in a child.
            return Verification(case, verify_in_child(resolved, maxtext_against(other)), command=command)
        if isinstance(resolved, StepCase):
            function = load_step_function(resolved.ref)
            report = verify_step_function(function, resolved.ref, resolved.topology)
            return Verification(case, report, command=command)
        against = resolve_golden_case(other) if other is not None else None
        if isinstance(against, StepCase):  # `verified_against` allows none: a step is no model's case
            raise ShardscopeError(f"{case.case_id}: verify: {other and other.case_id} is a step case")
        if isinstance(against, MaxTextCase):  # `verified_against` refuses a reference case verified so
            raise ShardscopeError(f"{case.case_id}: verify: {other and other.case_id} is MaxText's own program")
        return Verification(case, verify_case(resolved, against), command=command)
    except ShardscopeError as err:
        return Verification(case, None, str(err))


def verify_golden_cases(cases: Sequence[GoldenCase], whole_set: Sequence[GoldenCase]) -> list[Verification]:
    """Every case of `cases` that carries `verify:`, verified in this process (its device pool sized for the
    largest of their topologies, if JAX has not started yet) or, for `maxtext:` cases, each in a child."""
    chosen = [case for case in cases if case.verify]
    if not chosen:
        return []
    prepare_compiler_log()
    # A `maxtext:` case runs in a child process with its own devices; this pool is for the others.
    in_process = [get_topology(case.topology).num_devices for case in chosen if not case.is_maxtext]
    if in_process:
        configure_cpu_devices(max(in_process))
    return [verify_golden_case(case, whole_set) for case in chosen]
