"""A weight's collectives: its all-gather per layer, and its gradient's sum over the data-parallel axes.

FSDP keeps each weight split and gathers the per-layer slice where a layer uses it; with remat the backward
pass recomputes the layer and gathers it again. Each device's gradient of that slice is partial (it saw only
its share of the batch) and is summed over the batch axes: on the compiled goldens, CPU and TPU alike, as an
all-reduce of the whole per-layer gradient (the compiler often combines several into one row; the traffic per
axis is what the prediction keeps).
"""

from __future__ import annotations

from shardscope.case.rules import Rule
from shardscope.plan.document import Plan
from shardscope.plan.records import Cause, CollectiveRow, RuleCause
from shardscope.predict.layout import Weight, in_mesh_order, layer_row
from shardscope.predict.rules import rules_on


def weight_gathers(
    plan: Plan, weight: Weight, rules: tuple[Rule, ...], remat: bool, dtype: str
) -> tuple[CollectiveRow, ...]:
    """The forward all-gather of the weight's per-layer slice over the axes that split it, and with remat the
    same again in the backward pass; () for a weight no axis splits (expert dims stay split). `dtype`: what
    travels (`layout.moved_dtype`)."""
    axes = weight.gathered_axes
    if not axes:
        return ()
    cause = Cause(
        tensors=(weight.path,),
        consumer=f"{weight.module}/dot_general",
        line=None,
        rules=rules_on(plan, weight.path, weight.record, axes, rules),
    )
    passes = ("forward", "backward") if remat else ("forward",)
    return tuple(_per_layer("all-gather", weight, axes, pass_, cause, dtype) for pass_ in passes)


def gradient_sum(
    plan: Plan, weight: Weight, batch: tuple[str, ...], batch_rules: tuple[RuleCause, ...], dtype: str
) -> tuple[CollectiveRow, ...]:
    """The all-reduce of the weight's per-layer gradient over the token axes. Not over the axes it stays split
    on (an expert's tokens came to its devices; a tensor-parallel slice sees every token), nor over pipeline
    stages (each stage owns its layers)."""
    axes = in_mesh_order(plan, set(batch) - set(weight.kept_axes) - set(weight.stack_axes))
    if not axes:
        return ()
    cause = Cause(
        tensors=(f"grads/{weight.path}",), consumer=f"{weight.module}/dot_general", line=None, rules=batch_rules
    )
    return (_per_layer("all-reduce", weight, axes, "backward", cause, dtype),)


def _per_layer(op: str, weight: Weight, axes: tuple[str, ...], pass_: str, cause: Cause, dtype: str) -> CollectiveRow:
    """One collective of the weight's whole per-layer slice, once in each layer of its stack."""
    return layer_row(op, weight, axes, weight.layer_shape, dtype, pass_, cause)
