"""`predict_collectives` and `predicted_plan`: a tensors-only plan's collectives, predicted.

The predicted plan is an ordinary plan (parts tensors and collectives) whose provenance says
`predicted: true`, so it reads, writes, prices and diffs like a compiled one, and says what it is.
"""

from __future__ import annotations

import dataclasses

from shardscope.case.rules import Rule
from shardscope.plan.document import Plan
from shardscope.plan.records import CollectiveRow, RuleCause
from shardscope.predict.layout import token_axes, weights
from shardscope.predict.moe import moe_exchanges
from shardscope.predict.rules import preset_moe, preset_rules, rules_on
from shardscope.predict.weights import gradient_sum, weight_gathers

PREDICTED = "predicted"  # the provenance key a predicted plan carries (value True)
PREDICTED_PARTS = ("tensors", "collectives")
_PASS_ORDER = {"forward": 0, "backward": 1, "optimizer": 2, "other": 3}


def remat_on(plan: Plan) -> bool:
    """Whether the step recomputes each layer in the backward pass: on (the default) unless `--set remat=none`."""
    overrides = dict(plan.case.overrides)
    return overrides.get("remat", overrides.get("model.remat", "full")) != "none"


def _batch_rules(plan: Plan, axes: tuple[str, ...], rules: tuple[Rule, ...]) -> tuple[RuleCause, ...]:
    """The rules that split an activation's batch on the data-parallel axes (of the first activation that
    has such rules: they name why every weight gradient is partial per device)."""
    for path, record in plan.tensors:
        if record.kind == "activation":
            found = rules_on(plan, path, record, axes, rules, logical_prefix="activation_batch")
            if found:
                return found
    return ()


def predict_collectives(plan: Plan, remat: bool | None = None) -> tuple[CollectiveRow, ...]:
    """The collectives of the plan's train step predicted from its tensors (remat: the case's, by default).

    Predicted: weight all-gathers (forward, and backward with remat), weight-gradient all-reduces over the
    batch axes, MoE token all-to-alls (all_to_all strategy). Not predicted: activation resharding (attention
    over context or tensor axes, the embedding lookup, router outputs), pipeline-stage transfers, and the
    compiler's combining of rows (traffic per mesh axis is what to compare).
    """
    remat = remat_on(plan) if remat is None else remat
    rules = preset_rules(plan)
    batch = token_axes(plan)
    batch_rules = _batch_rules(plan, batch, rules)
    every = weights(plan)
    rows: list[CollectiveRow] = []
    for weight in every:
        rows.extend(weight_gathers(plan, weight, rules, remat))
        rows.extend(gradient_sum(plan, weight, batch, batch_rules))
    if preset_moe(plan) == "all_to_all":
        rows.extend(moe_exchanges(plan, tuple(w for w in every if w.is_expert), rules, remat))
    return tuple(sorted(rows, key=lambda row: (_PASS_ORDER.get(row.pass_, 9), row.source, row.op)))


def predicted_plan(plan: Plan, remat: bool | None = None) -> Plan:
    """The plan with predicted collectives, no memory or compiled work, and `predicted: true` provenance."""
    provenance = (*((key, value) for key, value in plan.provenance if key != PREDICTED), (PREDICTED, True))
    return dataclasses.replace(
        plan,
        provenance=tuple(sorted(provenance)),
        collectives=predict_collectives(plan, remat),
        memory=(),
        compute=(),
        work=(),
        estimate=None,
        findings=(),
        parts=PREDICTED_PARTS,
    )
