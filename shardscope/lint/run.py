"""The findings of a case: every check run over what planning it produced, minus what the preset silences.

`plan_findings` is what `dump` writes into a plan (so the plan cache keeps findings with the plan they were
found on). Planning a case for `lint` (and what to do when planning stops) is the caller's:
`shardscope.golden.planning.lint_case`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from shardscope.case.gpu import load_gpu_hardware
from shardscope.case.hardware import Hardware, load_hardware
from shardscope.case.lints import COMPILE, LINTS
from shardscope.case.preset_lint import LintSettings
from shardscope.case.resolve import Case
from shardscope.case.rules import Indivisible
from shardscope.case.topology import Topology
from shardscope.lint.context import LintContext, LogicalAxes
from shardscope.lint.registry import CHECKS
from shardscope.plan.document import Plan
from shardscope.plan.findings import Finding, sort_findings


def case_hardware(case: Case) -> Hardware | None:
    """The TPU generation a case is planned for (None on CPU topologies)."""
    return topology_hardware(case.topology)


def topology_hardware(topology: Topology) -> Hardware | None:
    """The TPU generation of a topology (None on CPU topologies)."""
    if topology.tpu is None:
        return None
    return load_hardware(topology.tpu.name)


# A lint that summarises findings another lint would make → that lint. Silencing the other silences the summary
# too: the built-in presets silence dead-rule because MaxText's files serve every model family.
SUMMARISED = {"rules-for-other-models": "dead-rule"}


def silenced(finding: Finding, settings: LintSettings) -> bool:
    """Whether the preset silences a finding: its lint (or the lint it summarises) wholly, or for a subject
    containing some text."""
    if finding.lint in settings.ignore or SUMMARISED.get(finding.lint) in settings.ignore:
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
        cluster=case.topology.gpu,
        gpu=None if case.topology.gpu is None else load_gpu_hardware(case.topology.gpu.generation),
    )
    return run_checks(ctx, case.preset.lint)


def with_findings(plan: Plan, findings: Iterable[Finding]) -> Plan:
    """The plan with its `findings` section."""
    return dataclasses.replace(plan, findings=sort_findings(findings))
