"""The findings of a case: every check run over what planning it produced, minus what the preset silences.

`plan_findings` is what `dump` writes into a plan (so the plan cache keeps findings with the plan they were
found on); `lint_case` is the `lint` command: it also reports tensors that planning would stop at
(indivisible dimensions, found by a lenient trace) and a compiler that refuses the step for lack of memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardscope.errors import MemoryExhaustedError, ShardingError
from shardscope.lint.catalogue import COMPILE, LINTS
from shardscope.lint.context import LintContext, LogicalAxes
from shardscope.lint.finding import Finding, sort_findings
from shardscope.lint.registry import CHECKS
from shardscope.lint.step_checks import check_hbm, compile_refusal
from shardscope.plan import Plan
from shardscope.presets import LintSettings
from shardscope.rules import Indivisible

if TYPE_CHECKING:
    from shardscope.case import Case
    from shardscope.cost.hardware import Hardware


def case_hardware(case: Case) -> Hardware | None:
    """The TPU generation a case is planned for (None on CPU topologies)."""
    if case.topology.tpu is None:
        return None
    from shardscope.cost.hardware import load_hardware

    return load_hardware(case.topology.tpu.name)


def silenced(finding: Finding, settings: LintSettings) -> bool:
    """Whether the preset silences a finding: its lint wholly, or for a subject containing some text."""
    if finding.lint in settings.ignore:
        return True
    return any(lint == finding.lint and text in finding.subject for lint, text in settings.ignore_subjects)


def run_checks(ctx: LintContext, settings: LintSettings | None = None) -> tuple[Finding, ...]:
    """Every check (but those needing a compile the plan lacks), without what `settings` silence, sorted."""
    settings = settings or LintSettings()
    compiled = ctx.plan.holds("collectives")
    findings = [
        finding
        for lint_id, check in CHECKS.items()
        if lint_id not in settings.ignore and (compiled or LINTS[lint_id].stage != COMPILE)
        for finding in check(ctx)
    ]
    return sort_findings(f for f in findings if not silenced(f, settings))


def plan_findings(
    case: Case,
    plan: Plan,
    resolved: frozenset[LogicalAxes] = frozenset(),
    compiler_log: str | None = None,
    indivisible: tuple[Indivisible, ...] = (),
    hardware: Hardware | None = None,
) -> tuple[Finding, ...]:
    """The findings on a case's plan, without those the preset silences (`lint: {ignore: [...]}`).

    Args:
      case: the case planned.
      plan: its plan (tensors only, or compiled).
      resolved: the logical-axes tuples the model resolved while tracing.
      compiler_log: the compiler's captured stderr (None: not compiled, or not capturable here).
      indivisible: tensors a lenient trace found indivisible.
      hardware: the generation to check HBM against (default: the case's TPU generation, if any).
    """
    ctx = LintContext(
        preset=case.preset,
        plan=plan,
        resolved=resolved,
        indivisible=indivisible,
        compiler_log=compiler_log,
        hardware=hardware if hardware is not None else case_hardware(case),
        slices=case.topology.slices,
    )
    return run_checks(ctx, case.preset.lint)


def with_findings(plan: Plan, findings: Iterable[Finding]) -> Plan:
    """The plan with its `findings` section."""
    return dataclasses.replace(plan, findings=sort_findings(findings))


@dataclass(frozen=True)
class LintReport:
    """What `shardscope lint` found on a case, and what it could not check."""

    plan: Plan
    findings: tuple[Finding, ...]
    compiled: bool
    notes: tuple[str, ...] = ()


def lint_case(case: Case, compile: bool = True, hardware: Hardware | None = None, use_cache: bool = True) -> LintReport:
    """Lints a validated case: plans it (from the plan cache when unchanged) and reads its findings.

    A tensor whose mesh axes do not divide it stops planning; here it is a finding, and every other such
    tensor is found by tracing on with those dimensions replicated (the compile-based lints are then
    skipped: the program compiled would not be the one the rules describe). A TPU compiler that cannot fit
    the step in memory is an `hbm-overflow` finding, and the trace-based lints still run.

    Args:
      case: the case.
      compile: also run the lints that need the compiled step (collectives, compiler warnings, memory).
      hardware: check HBM against this generation (default: the case's TPU generation, if any).
      use_cache: take an unchanged case's plan from the plan cache.
    """
    from shardscope.api import plan_resolved_case

    notes: list[str] = []
    try:
        plan = plan_resolved_case(case, tensors_only=not compile, use_cache=use_cache)
    except ShardingError:
        from shardscope.compile import trace_case
        from shardscope.extract import extract_tensors_plan

        step = trace_case(case, lenient=True)
        plan = extract_tensors_plan(step)
        findings = plan_findings(case, plan, step.resolved, None, step.indivisible, hardware)
        if step.stopped is not None:
            # A partial trace misses names and tensors: only what it found indivisible is reliable.
            findings = tuple(f for f in findings if f.lint == "indivisible-dim")
            why = step.stopped if len(step.stopped) < 160 else step.stopped[:157] + "…"
            notes.append(f"the model could not be traced to the end, so only indivisible-dim ran ({why})")
        if compile:
            notes.append("not compiled: the mesh axes do not divide some tensors (see indivisible-dim)")
        return LintReport(with_findings(plan, findings), findings, False, tuple(notes))
    except MemoryExhaustedError as err:
        plan = plan_resolved_case(case, tensors_only=True, use_cache=use_cache)
        ctx = LintContext(preset=case.preset, plan=plan)
        refusal = [f for f in [compile_refusal(ctx, str(err))] if not silenced(f, case.preset.lint)]
        findings = sort_findings([*plan.findings, *refusal])
        notes.append("the compiler refused the step; collective lints need a step that compiles")
        return LintReport(with_findings(plan, findings), findings, False, tuple(notes))
    findings = plan.findings
    if hardware is not None and hardware != case_hardware(case):
        ctx = LintContext(preset=case.preset, plan=plan, hardware=hardware)
        overflow = [f for f in check_hbm(ctx) if not silenced(f, case.preset.lint)]
        findings = sort_findings([f for f in findings if f.lint != "hbm-overflow"] + overflow)
    return LintReport(plan, findings, plan.holds("collectives"), tuple(notes))
