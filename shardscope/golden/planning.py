"""A case planned end to end: trace or compile, extract, lint — through the plan cache.

`plan_resolved_case` takes an unchanged case's plan from the plan cache (a hit starts no JAX backend: the
compiling half, `golden.pipeline`, loads only on a miss); `lint_case` is what `shardscope lint` plans, with
what to report when planning stops (an indivisible dimension, a step the compiler cannot fit).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardscope.case.hardware import Hardware
from shardscope.case.maxtext_model import MaxTextCase
from shardscope.case.presets import Preset
from shardscope.case.resolve import Case
from shardscope.errors import MemoryExhaustedError, ShardingError
from shardscope.golden.cache import case_key, load_plan_text, store
from shardscope.lint.context import LintContext
from shardscope.lint.run import case_hardware, plan_findings, silenced, with_findings
from shardscope.lint.step_checks import check_hbm, compile_refusal
from shardscope.plan.document import Plan
from shardscope.plan.findings import Finding, sort_findings
from shardscope.plan.json import plan_from_json, plan_to_json


def plan_resolved_case(case: Case, tensors_only: bool = False, use_cache: bool = True) -> Plan:
    """The plan of a validated case: from the plan cache when its inputs are unchanged, else planned (and
    cached). A cache hit starts no JAX backend."""
    key = case_key(case, tensors_only) if use_cache else None
    cached = load_plan_text(key) if key is not None else None
    if cached is not None:
        return plan_from_json(cached, "cached plan")
    from shardscope.golden import pipeline  # lazy: a cache hit starts no JAX backend

    pipeline.configure_devices(case.topology)
    plan = pipeline.plan_case(case, tensors_only=tensors_only)
    if key is not None:
        store(key, plan_to_json(plan))
    return plan


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
    notes: list[str] = []
    try:
        plan = plan_resolved_case(case, tensors_only=not compile, use_cache=use_cache)
    except ShardingError:
        from shardscope.golden import pipeline  # lazy: loads JAX

        step = pipeline.trace_case(case, lenient=True)
        plan = pipeline.extract_tensors_plan(step)
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


def lint_maxtext_case(
    case: MaxTextCase, compile: bool = True, hardware: Hardware | None = None
) -> tuple[LintReport, tuple[str, ...]]:
    """Lints MaxText's own program of a `maxtext:` case (`compile`: the compile-based lints too), and the lints
    silenced for MaxText's shared rules. A step the TPU compiler cannot fit is an `hbm-overflow` finding."""
    from shardscope.golden import pipeline  # lazy: loads JAX and MaxText
    from shardscope.stages.maxtext_program import MAXTEXT_RULE_LINTS

    silenced = MAXTEXT_RULE_LINTS.ignore
    try:
        plan = pipeline.plan_maxtext_case(case, tensors_only=not compile, hardware=hardware)
    except MemoryExhaustedError as err:
        plan = pipeline.plan_maxtext_case(case, tensors_only=True, hardware=hardware)
        ctx = LintContext(preset=Preset(name=case.rule, mesh_axes=()), plan=plan)
        findings = sort_findings([*plan.findings, compile_refusal(ctx, str(err))])
        note = "the compiler refused the step; collective lints need a step that compiles"
        return LintReport(with_findings(plan, findings), findings, False, (note,)), silenced
    return LintReport(plan, plan.findings, plan.holds("collectives")), silenced
