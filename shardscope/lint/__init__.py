"""Lints: the sharding-rule mistakes reviewers catch by eye, found by reading a case's plan.

The map: `catalogue` (every lint's id, severity and explanation), `finding` (the record and its JSON),
`context` (what the checks read: the preset, the plan, the logical axes the model resolved, the compiler's
warnings), `rule_checks` (dead, shadowed and size-1 rules, names no rule mentions), `tensor_checks`
(indivisible and silently replicated dimensions, names in the wrong place, large replicated weights),
`step_checks` (collectives in the layer loop, HBM), `remat` (the compiler's involuntary rematerialisation
warnings), `registry` (id → check) and `run` (findings of a case). Importing this package imports no JAX.
"""

from shardscope.case.lints import LINT_IDS, LINTS, LintInfo, get_lint
from shardscope.plan.findings import SEVERITIES, Finding, severity_rank, sort_findings

__all__ = ["LINTS", "LINT_IDS", "SEVERITIES", "Finding", "LintInfo", "get_lint", "severity_rank", "sort_findings"]
