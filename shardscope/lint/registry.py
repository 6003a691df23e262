"""Lint id → check: the functions that find what the catalogue describes, in catalogue order."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from shardscope.case.lints import LINT_IDS
from shardscope.lint.context import LintContext
from shardscope.lint.gpu_checks import check_network_collectives, check_tensor_parallel_across_network
from shardscope.lint.remat import check_remat
from shardscope.lint.rule_checks import (
    check_absent_axes,
    check_dead_rules,
    check_rules_for_other_models,
    check_shadowed_rules,
    check_unit_axes,
    check_unmatched_names,
)
from shardscope.lint.step_checks import check_dcn_collectives, check_expert_gathers, check_hbm
from shardscope.lint.tensor_checks import (
    check_activation_names_on_weights,
    check_dcn_weights,
    check_indivisible,
    check_large_replicated,
    check_moe_names_outside_moe,
    check_silently_replicated,
    check_weight_names_on_activations,
)
from shardscope.plan.findings import Finding

# A check reads one case and yields what it finds (each finding carries its lint's id).
Check = Callable[[LintContext], Iterable[Finding]]

CHECKS: dict[str, Check] = {
    "dead-rule": check_dead_rules,
    "rules-for-other-models": check_rules_for_other_models,
    "shadowed-rule": check_shadowed_rules,
    "unmatched-name": check_unmatched_names,
    "absent-axis-rule": check_absent_axes,
    "unit-axis-rule": check_unit_axes,
    "indivisible-dim": check_indivisible,
    "silently-replicated": check_silently_replicated,
    "activation-name-on-weight": check_activation_names_on_weights,
    "weight-name-on-activation": check_weight_names_on_activations,
    "moe-name-outside-moe": check_moe_names_outside_moe,
    "large-replicated": check_large_replicated,
    "involuntary-remat": check_remat,
    "expert-gather-in-loop": check_expert_gathers,
    "dcn-weight-in-loop": check_dcn_weights,
    "dcn-collective-in-loop": check_dcn_collectives,
    "network-collective-in-loop": check_network_collectives,
    "tensor-parallel-across-network": check_tensor_parallel_across_network,
    "hbm-overflow": check_hbm,
}

if tuple(CHECKS) != LINT_IDS:
    raise ImportError("every lint in the catalogue needs exactly one check, in catalogue order")
