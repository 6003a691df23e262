"""A pipeline's collectives (`reference_models/pipeline.py`): its loop state's rotations, and what crosses its edge.

Inside, at every iteration, each of the loop state's buffers moves one stage along (a collective-permute of
a microbatch's residual stream over the stage axes): `shift` carries each stage's output to the next, which
waits for it (a hand-off); `state_io` hands each stage's slot of inputs and outputs to the stage before it;
in a circular schedule that stores outputs between visits, the last output goes round to stage 0's store.
The backward pass runs each of them transposed, overlapped with the recomputed forward pass.

At its edge, with Explicit mesh axes: the reshapes into and out of the loop state gather the microbatches
over the stages on the way in and the outputs on the way out (and the outputs' gradient in the backward
pass); each stage's weights are gathered whole over the other axes once per step in each pass (placed on
the stage axis alone at every iteration, MaxText's `shard_dim_by_stages` without a spec, which the scan
hoists out of its loop), and in a CPU program its loop state too, besides the gathers each layer makes
inside; and the logits' gradient, split over the stages outside, is gathered over them to meet the output,
and over every batch axis for the output head's weight gradient (the head runs on the logits' split).
Not followed yet: the MoE models' explicit pipelines, whose vmap over the stages batches the MoE's
shard_map with the stage dimension replicated (tests/test_predict.py: UNFOLLOWED_PIPELINES). Not predicted: the
all-to-alls over the batch axes that split the batch into contiguous microbatches and join them again
(Auto and Explicit alike; MaxText's own programs have them too), a few hundred MB per step on seed 003.
"""

from __future__ import annotations

import math

from shardscope.case.resolve import Case
from shardscope.case.rules import entry_axes
from shardscope.hlo.groups import signed_shift
from shardscope.plan.document import Plan
from shardscope.plan.records import Cause, CollectiveRow, is_stack_name
from shardscope.predict.layout import Weight, collective_row, in_mesh_order, mesh_sizes, zero1_axes

EXPLICIT = "explicit"  # a plan's axis_types when its mesh axes are Explicit


def pipeline_collectives(
    plan: Plan, every: tuple[Weight, ...], case: Case | None, tokens: int, micro_tokens: int, batch: tuple[str, ...]
) -> tuple[CollectiveRow, ...]:
    """Every collective of a pipelined stack (see the module doc); () outside pipelines. `tokens`: a device's
    tokens outside the pipeline; `micro_tokens`: a microbatch's inside; `batch`: the token axes."""
    staged = next((w for w in every if w.stack_axes), None)
    if staged is None or case is None or case.preset.pipeline is None:
        return ()
    pipeline, model = case.preset.pipeline, case.model
    stages = staged.stack_axes
    sizes = mesh_sizes(plan)
    dtype = model.dtype
    module = "/".join(staged.module.split("/")[:2])  # the stack: "decoder/layers"
    micro = (micro_tokens, model.embed_dim)
    size = math.prod(sizes[a] for a in stages)
    # (buffer, the shift it moves by, whether the next iteration waits for it); the backward pass moves each
    # the other way.
    rotations = [("shift", 1, True), ("state_io", -1, False)]
    if pipeline.repeats > 1 and pipeline.microbatches > size:
        rotations.append(("circ_storage", 1, False))
    rows = []
    for buffer, shift, handoff in rotations:
        send = Cause(tensors=(), consumer=f"{module}/pipeline/{buffer}", line=None, rules=())
        for pass_, moved, waited in (("forward", shift, handoff), ("backward", -shift, False)):
            rows.append(
                collective_row(
                    "collective-permute",
                    stages,
                    micro,
                    dtype,
                    pass_,
                    module,
                    send,
                    trips=staged.loop_trips,
                    shift=signed_shift(moved, size),
                    handoff=waited,
                )
            )
    if plan.case.axis_types != EXPLICIT:
        return tuple(rows)
    # A device's tokens with the stage split undone: what the edge gathers.
    edge = (tokens * size, model.embed_dim)
    cause = Cause(tensors=(), consumer=f"{module}/pipeline_edge", line=None, rules=())
    rows += [collective_row("all-gather", stages, edge, dtype, p, module, cause) for p in ("forward", "backward")]
    rows.append(collective_row("all-gather", stages, edge, dtype, "forward", module, cause))
    rows.append(collective_row("all-gather", stages, (edge[0], model.vocab_size), dtype, "backward", module, cause))
    # The output head's matmul runs on the logits' split of the batch (MaxText's out_sharding, the stage axis
    # among its axes): its weight's gradient gathers the logits' gradient over every one of those axes.
    head = in_mesh_order(plan, set(batch) | set(stages))
    whole = tokens * math.prod(sizes[a] for a in head)
    rows.append(collective_row("all-gather", head, (whole, model.vocab_size), dtype, "backward", module, cause))
    closed = in_mesh_order(plan, set(batch) - set(stages))
    # A TPU program keeps the loop state split at the edge (seed 003's explicit compiles for v5p-8, with and
    # without ZeRO-1 or the weights gathered once, have none of these gathers); a CPU program gathers it.
    if closed and dict(plan.provenance).get("backend") != "tpu":
        # Two buffers of a stage's `state_io` size (its microbatches; seed 003's CPU compiles gather two in
        # each pass), and in the forward pass the inputs the remat keeps of every layer at every iteration.
        micro_whole = micro_tokens * math.prod(sizes[a] for a in closed)
        buffers = 2 * case.global_batch * model.seq_len // size
        kept = _layers_per_visit(every) * staged.loop_trips * micro_whole
        for pass_, moved in (("forward", buffers + kept), ("backward", buffers)):
            rows.append(collective_row("all-gather", closed, (moved, model.embed_dim), dtype, pass_, module, cause))
    for weight in every:
        if weight.stack_axes:
            rows += _weight_edge(plan, weight, sizes, (*pipeline.gathered_once, *zero1_axes(plan, case)))
    return tuple(rows)


def _layers_per_visit(every: tuple[Weight, ...]) -> int:
    """How many layers a stage runs per visit: as many as the copies of one layer its weights form (the
    modules at one depth of the stage's weights' paths, each holding the same weights, as tensors, below it;
    1 where there are no such copies)."""
    staged = [(w.module.split("/"), w.record) for w in every if w.stack_axes]
    found = 1
    for depth in range(min((len(parts) for parts, _ in staged), default=0)):
        copies: dict[str, set[tuple[object, ...]]] = {}
        for parts, record in staged:
            below = (*parts[:depth], *parts[depth + 1 :], record.shape, record.logical, record.spec, record.dtype)
            copies.setdefault(parts[depth], set()).add(below)
        if len(copies) > 1 and all(held == next(iter(copies.values())) for held in copies.values()):
            found = max(found, len(copies))
    return found


def _weight_edge(plan: Plan, weight: Weight, sizes: dict[str, int], once: tuple[str, ...]) -> list[CollectiveRow]:
    """A stage's slice of a stacked weight gathered whole over the other axes at the pipeline's edge, one
    split dimension at a time from the last (each gather's result is the next one's input), in each pass;
    not over the axes it was gathered over before the schedule (`once`: `pipeline.fsdp_gather_once`'s and
    ZeRO-1's, see `weights.weight_gathers`)."""
    record = weight.record
    logical = record.logical or (None,) * len(record.shape)
    shape = list(record.shard_shape)
    rows: list[CollectiveRow] = []
    cause = Cause(tensors=(weight.path,), consumer=f"{weight.module}/pipeline_edge", line=None, rules=())
    for dim in reversed(range(len(shape))):
        if is_stack_name(logical[dim]):
            continue
        axes = in_mesh_order(plan, set(entry_axes(record.spec[dim])) - set(once))
        if not axes:
            continue
        shape[dim] *= math.prod(sizes[a] for a in axes)
        for pass_ in ("forward", "backward"):
            rows.append(collective_row("all-gather", axes, tuple(shape), record.dtype, pass_, weight.module, cause))
    return rows
