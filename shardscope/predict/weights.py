"""A weight's collectives: its all-gather per layer, and its gradient's sum over the data-parallel axes.

FSDP keeps each weight split and gathers the per-layer slice where a layer uses it; with remat the backward
pass recomputes the layer and gathers it again. Each device's gradient of that slice is partial (it saw only
its share of the batch) and is summed over the batch axes: on the compiled goldens, CPU and TPU alike, as an
all-reduce of the whole per-layer gradient (the compiler often combines several into one row; the traffic per
axis is what the prediction keeps).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from shardscope.case.rules import Rule, entry_axes
from shardscope.plan.document import Plan
from shardscope.plan.records import Cause, CollectiveRow, RuleCause
from shardscope.predict.layout import Weight, collective_row, in_mesh_order, layer_row, mesh_sizes
from shardscope.predict.rules import rules_on

WEIGHT_USE = "/dot_general"  # the consumer a weight's gather and gradient sum name (`<module>/dot_general`)


def weight_gathers(
    plan: Plan,
    weight: Weight,
    rules: tuple[Rule, ...],
    remat: bool,
    dtype: str,
    once: tuple[str, ...] = (),
    zero1: tuple[str, ...] = (),
    regathers: int = 1,
) -> tuple[CollectiveRow, ...]:
    """The forward all-gather of the weight's per-layer slice over the axes that split it, and with remat (in
    a layer stack) the same again in the backward pass, `regathers` times; () for a weight no axis splits
    (expert dims stay split). `dtype`: what travels (`layout.moved_dtype`). Gathered whole once per step
    instead: over `once`, the axes a pipeline gathers its stack's weights over before its schedule
    (`pipeline.fsdp_gather_once`), and over `zero1`, the axis ZeRO-1 stores every weight split on and the
    step gathers it back from (the TPU compiles name that gather the optimizer's: the updated weights')."""
    axes = weight.gathered_axes
    if not axes:
        return ()
    cause = Cause(
        tensors=(weight.path,),
        consumer=f"{weight.module}{WEIGHT_USE}",
        line=None,
        rules=rules_on(plan, weight.path, weight.record, axes, rules),
    )
    rows: list[CollectiveRow] = []
    sizes = mesh_sizes(plan)
    held = math.prod(weight.record.shard_shape)
    for gathered, pass_ in ((zero1, "optimizer"), (once if weight.stack_axes else (), "forward")):
        before = in_mesh_order(plan, set(axes) & set(gathered))
        if before:
            held *= math.prod(sizes[a] for a in before)
            rows.append(collective_row("all-gather", before, (held,), dtype, pass_, weight.module, cause))
            axes = tuple(a for a in axes if a not in before)
    if not axes:
        return tuple(rows)
    # Only the layer stack is rematerialised: a weight outside it (the logits projection, the final norm)
    # keeps its gathered copy for the backward pass.
    rows.append(_per_layer("all-gather", weight, axes, "forward", cause, dtype))
    if remat and weight.stacked:
        again = _per_layer("all-gather", weight, axes, "backward", cause, dtype)
        rows.append(dataclasses.replace(again, count=again.count * regathers))
    return tuple(rows)


STORED_DTYPE = "stored"  # `GatheredOnce.per_step`: the weight's dtype as stored


@dataclass(frozen=True)
class GatheredOnce:
    """Weights gathered once per step rather than in every layer: a pipeline's stack over `axes`, before
    its schedule (`pipeline.fsdp_gather_once`), and every weight over ZeRO-1's axis (`zero1`); and how the
    compiled step sums their gradient over those axes.

    `carried`: the dtype a TPU program with Auto axes sums it in, once for the stack, after carrying the
    partial sums through the schedule (MaxText's own compiles of seed 003 do so too). None: summed at every
    step, as over any token axis (a CPU program; Explicit axes, whose types make every step's gradient
    whole), in `per_step` (None: the gradient's dtype; `STORED_DTYPE`: the weight's as stored, in which a TPU
    program with Explicit axes sums each iteration's gradient of a pipeline's weights, as MaxText's own
    compiles of seed 003 do)."""

    axes: tuple[str, ...] = ()
    carried: str | None = None
    per_step: str | None = None
    zero1: tuple[str, ...] = ()


def gradient_sum(
    plan: Plan,
    weight: Weight,
    batch: tuple[str, ...],
    batch_rules: tuple[RuleCause, ...],
    dtype: str,
    once: GatheredOnce | None = None,
) -> tuple[CollectiveRow, ...]:
    """The all-reduce of the weight's per-layer gradient over the token axes. Not over the axes it stays split
    on (an expert's tokens came to its devices; a tensor-parallel slice sees every token), nor over pipeline
    stages (each stage owns its layers), nor over axes its input is gathered over (`input_token_axes`).
    `once`: weights gathered once per step, which the layers use whole over those axes."""
    tokens = set(batch) & input_token_axes(plan, weight, batch)
    axes = in_mesh_order(plan, tokens - set(weight.kept_axes) - set(weight.stack_axes))
    if not axes:
        return ()
    cause = Cause(
        tensors=(f"grads/{weight.path}",), consumer=f"{weight.module}/dot_general", line=None, rules=batch_rules
    )
    once = once if once is not None else GatheredOnce()
    # A pipeline's once-gathered axes are its stack's weights'; ZeRO-1's axis is every weight's.
    whole_over = set(once.zero1) | (set(once.axes) if weight.stack_axes else set())
    after = in_mesh_order(plan, set(axes) & whole_over) if weight.stack_axes else ()
    rows: list[CollectiveRow] = []
    if after and once.carried is not None:
        # The stage's layers' gradients (every visit's) summed once.
        rows.append(
            collective_row(
                "all-reduce",
                after,
                weight.layer_shape,
                once.carried,
                "backward",
                weight.module,
                cause,
                weight.held_layers,
            )
        )
        axes = tuple(a for a in axes if a not in after)
        if not axes:
            return tuple(rows)
    elif after and once.per_step is not None:
        dtype = weight.record.dtype if once.per_step == STORED_DTYPE else once.per_step
    # Over the axes the weight is split on, the whole gradient is summed and each device keeps its shard;
    # over the batch axes it is not split on (pure data parallelism for this weight), only that shard is
    # summed, as the compiled goldens do it.
    split = tuple(a for a in axes if a in weight.gathered_axes and a not in whole_over)
    rest = tuple(a for a in axes if a not in split)
    if not split or not rest:
        return (*rows, _per_layer("all-reduce", weight, axes, "backward", cause, dtype))
    sizes = mesh_sizes(plan)
    shard = (max(1, math.prod(weight.layer_shape) // math.prod(sizes[a] for a in split)),)
    return (
        *rows,
        _per_layer("all-reduce", weight, split, "backward", cause, dtype),
        layer_row("all-reduce", weight, rest, shard, dtype, "backward", cause),
    )


def input_token_axes(plan: Plan, weight: Weight, batch: tuple[str, ...]) -> set[str]:
    """The axes that split the tokens of the weight's input where the layer uses it: an attention block may
    gather its input whole over some token axes (context parallelism whose attention reads whole
    sequences), and then each device's gradient of its projections covers those axes' tokens already.
    The batch axes where the input is not recorded (`Weight.reads`)."""
    record = weight.reads
    if record is None:
        return set(batch)
    return {axis for entry in record.spec[:-1] for axis in entry_axes(entry)}


def _per_layer(op: str, weight: Weight, axes: tuple[str, ...], pass_: str, cause: Cause, dtype: str) -> CollectiveRow:
    """One collective of the weight's whole per-layer slice, once in each layer of its stack (once per step
    for a weight the same at every trip, `Weight.invariant`)."""
    row = layer_row(op, weight, axes, weight.layer_shape, dtype, pass_, cause)
    return dataclasses.replace(row, loop_trips=1) if weight.invariant and op == "all-gather" else row
