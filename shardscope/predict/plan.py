"""`predict_collectives` and `predicted_plan`: a tensors-only plan's collectives, predicted.

The predicted plan is an ordinary plan (parts tensors and collectives) whose provenance says
`predicted: true`, so it reads, writes, prices and diffs like a compiled one, and says what it is.
"""

from __future__ import annotations

import dataclasses

from shardscope.case.resolve import Case
from shardscope.case.rules import Rule
from shardscope.hlo.kinds import WorkKind
from shardscope.plan.document import Plan
from shardscope.plan.records import CollectiveRow, RuleCause
from shardscope.predict.activations import tensor_parallel_sums
from shardscope.predict.context import context_attention
from shardscope.predict.embedding import lookup_collectives
from shardscope.predict.layout import Placement, dot_operand_dtype, moved_dtype, placement_of, zero1_axes
from shardscope.predict.moe import expert_partial_sums, expert_token_sums, moe_exchanges
from shardscope.predict.pipeline import pipeline_collectives
from shardscope.predict.rules import preset_moe, preset_rules, rules_on
from shardscope.predict.weights import STORED_DTYPE, GatheredOnce, gradient_sum, weight_gathers
from shardscope.predict.work import expert_slots, kept_outputs, predicted_work, recomputed

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


def predict_collectives(
    plan: Plan, remat: bool | None = None, placement: Placement | None = None, causes: bool = True
) -> tuple[CollectiveRow, ...]:
    """The collectives of the plan's train step predicted from its tensors (remat: the case's, by default;
    `causes=False` leaves the rows' rules unnamed, which a search ranking thousands of meshes does not read).

    Predicted: weight all-gathers (forward, and backward with remat), weight-gradient all-reduces over the
    batch axes, tensor parallelism's partial sums of activations, attention's key and value gathers over
    context axes, a pipeline's stage-to-stage permutes, MoE token all-to-alls (all_to_all strategy). Not
    predicted: other activation resharding (the embedding lookup, router outputs, two constraints with
    different specs), and the compiler's combining of rows (traffic per mesh axis is what to compare).
    """
    remat = remat_on(plan) if remat is None else remat
    found = placement or placement_of(plan)
    case, batch, every = found.case, found.batch_axes, found.weights
    rules = preset_rules(plan) if causes else ()
    batch_rules = _batch_rules(plan, batch, rules) if causes else ()
    rows: list[CollectiveRow] = []
    on_tpu = dict(plan.provenance).get("backend") == "tpu"
    pipeline = case.preset.pipeline if case is not None else None
    once = pipeline.gathered_once if pipeline is not None else ()
    zero1 = zero1_axes(plan, case)
    saved = kept_outputs(case)
    summed_once = None
    if (once or zero1) and case is not None:
        auto = plan.case.axis_types != "explicit"
        narrow = dot_operand_dtype(moved_dtype("float32", case.model.dtype))
        carried = narrow if on_tpu and auto and pipeline is not None else None
        # With Explicit axes each iteration's gradient of the stack's weights is summed as they are stored.
        per_step = STORED_DTYPE if on_tpu and not auto and pipeline is not None else None
        summed_once = GatheredOnce(once, carried, per_step, zero1)
    for weight in every:
        dtype = moved_dtype(weight.record.dtype, found.dtype)
        # A TPU program narrows a float32 weight with head or expert dimensions before gathering it.
        gathered = dot_operand_dtype(dtype) if on_tpu and len(weight.layer_shape) > 2 else dtype
        # In a layer loop, a TPU program gathers an attention projection whose matmul the backward pass runs
        # again twice there: for that matmul and for its input gradient's. Seen on every TPU compile with
        # such projections: all of Mixtral's and DeepSeek's, Llama's query and key (its value and output
        # projections once: a scheduling choice not visible before compiling; counted twice).
        looped = weight.loop_trips > 1
        twice = on_tpu and looped and weight.in_attention and recomputed(weight, saved)
        rows.extend(weight_gathers(plan, weight, rules, remat, gathered, once, zero1, 2 if twice else 1))
        rows.extend(gradient_sum(plan, weight, batch, batch_rules, dtype, summed_once))
    if found.dtype is not None:
        rows.extend(tensor_parallel_sums(plan, every, found.layer_tokens or found.tokens, found.dtype, remat))
    rows.extend(lookup_collectives(plan, case, found.tokens, batch))
    rows.extend(pipeline_collectives(plan, every, case, found.tokens, found.micro_tokens, batch))
    operand = dot_operand_dtype if on_tpu else str
    flash = case is not None and case.model.uses_flash_attention
    rows.extend(context_attention(plan, every, found.attention, remat, operand, flash))
    experts = tuple(w for w in every if w.is_expert)
    if preset_moe(plan) == "all_to_all":
        rows.extend(moe_exchanges(plan, experts, rules, remat, case, operand))
    rows.extend(expert_token_sums(plan, experts, case))
    rows.extend(expert_partial_sums(plan, experts, remat, lambda w: expert_slots(plan, w, case, found.tokens)))
    return tuple(sorted(rows, key=lambda row: (_PASS_ORDER.get(row.pass_, 9), row.source, row.op)))


def is_predicted(plan: Plan) -> bool:
    """Whether the plan's collectives and work were predicted, not compiled."""
    return dict(plan.provenance).get(PREDICTED) is True


def predicted_plan(plan: Plan, remat: bool | None = None, case: Case | None = None, causes: bool = True) -> Plan:
    """The plan with predicted collectives and work (`predict.work`), no compiled memory, and
    `predicted: true` provenance (`case`: the plan's case when the caller has it resolved; `causes`: as
    `predict_collectives`)."""
    remat = remat_on(plan) if remat is None else remat
    placement = placement_of(plan, case)
    work = predicted_work(plan, remat, placement)
    # The step's totals, as a compiled plan records its own (the whole-step roofline and summaries read them).
    device_work = [b for b in work if b.kind != WorkKind.HOST]
    compute = (("bytes_accessed", sum(b.bytes for b in device_work)), ("flops", sum(b.flops for b in device_work)))
    provenance = (*((key, value) for key, value in plan.provenance if key != PREDICTED), (PREDICTED, True))
    return dataclasses.replace(
        plan,
        provenance=tuple(sorted(provenance)),
        collectives=predict_collectives(plan, remat, placement, causes),
        memory=(),
        compute=compute,
        work=work,
        estimate=None,
        findings=(),
        parts=PREDICTED_PARTS,
    )
