"""The compiling half of planning: trace or compile a case (or a user's step), extract, lint. Loads JAX.

`golden.planning` reaches it only on a plan-cache miss, so a hit starts no JAX backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from shardscope.case.hardware import Hardware
from shardscope.case.maxtext_model import MaxTextCase
from shardscope.case.resolve import Case
from shardscope.case.topology import Topology
from shardscope.errors import ShardscopeError
from shardscope.extract.plans import extract_plan, extract_tensors_plan, plan_from_compiled
from shardscope.lint.context import LintContext
from shardscope.lint.run import plan_findings, run_checks, topology_hardware, with_findings
from shardscope.plan.document import Plan
from shardscope.stages.compile import compile_case, trace_case
from shardscope.stages.devices import configure_devices
from shardscope.stages.user_step import (
    StepError,
    StepRef,
    call_step_function,
    compile_step,
    load_step_function,
    one_line,
    topology_devices,
)


def plan_case(case: Case, tensors_only: bool = False) -> Plan:
    """The whole `dump` pipeline after validation: lower (and unless `tensors_only`, compile), extract, and
    lint (the plan's `findings`)."""
    if tensors_only:
        traced = trace_case(case)
        plan = extract_tensors_plan(traced)
        return with_findings(plan, plan_findings(case, plan, traced.resolved))
    step = compile_case(case)
    plan = extract_plan(step, step.compiled.as_text())
    log = step.compiler_log if step.compiler_log_visible else None
    return with_findings(plan, plan_findings(case, plan, step.resolved, log))


def plan_step_ref(ref: StepRef, topology: Topology, name: str | None = None) -> Plan:
    """Imports, calls and compiles a user's step on a topology and returns its plan.

    Raises:
      StepError: anything the protocol of `shardscope.stages.user_step` rules out, or a compile that fails
        (its first line).
    """
    configure_devices(topology)
    return plan_step_function(load_step_function(ref), topology, name or ref.name, ref)


def plan_step_function(function: Callable[..., Any], topology: Topology, name: str, ref: StepRef | None = None) -> Plan:
    """Calls a `make_step` function (the protocol of `shardscope.stages.user_step`) on the topology's devices and
    plans its step."""
    ref = ref or StepRef(getattr(function, "__module__", "?"), getattr(function, "__name__", "make_step"))
    step, args, mesh = call_step_function(function, ref, topology_devices(topology))
    try:
        plan = plan_from_compiled(compile_step(step, args, mesh), mesh, name)
    except ShardscopeError:
        raise
    except Exception as err:  # tracing or compiling the user's program
        raise StepError(f"--step {ref.text}: compiling the step failed ({one_line(err)})") from None
    # The function's name, not its module or file: a golden must not depend on where the checkout lives.
    case = dataclasses.replace(plan.case, preset=f"step {ref.function}", topology=topology.name)
    return dataclasses.replace(plan, case=case)


def plan_maxtext_case(case: MaxTextCase, tensors_only: bool = False, hardware: Hardware | None = None) -> Plan:
    """MaxText's own train step of a `maxtext:` case, planned as any case: built (and unless `tensors_only`,
    lowered and compiled), extracted and linted against MaxText's own rules (HBM against `hardware`, by
    default the topology's TPU generation)."""
    from shardscope.extract.maxtext_plan import maxtext_plan  # lazy: MaxText loads only for a maxtext: case
    from shardscope.stages.maxtext_program import build_maxtext_step, maxtext_preset

    configure_devices(case.topology)
    step = build_maxtext_step(case, lower=not tensors_only, compile_step=not tensors_only)
    plan = maxtext_plan(step)
    log = step.compiler_log if step.compiled is not None and step.compiler_log_visible else None
    ctx = LintContext(
        preset=maxtext_preset(step),
        plan=plan,
        compiler_log=log,
        hardware=hardware if hardware is not None else topology_hardware(case.topology),
        slices=case.topology.slices,
    )
    return with_findings(plan, run_checks(ctx, ctx.preset.lint))
