"""A pipeline's collectives (`reference_models/pipeline.py`): sends between stages, and what crosses its edge.

Inside: each microbatch's residual stream goes from one stage to the next once per iteration, and its
gradient back in the backward pass (a collective-permute over the stage axes each way per iteration); the
forward one is a hand-off (nothing hides it), the backward one overlaps the step's recomputed forward pass.

At its edge, once per step: outside the pipeline the batch is split over the stage axes too, so the stack's
input is gathered over them on the way in; every stage returns its outputs and only the last stage's are not
zero, so the outputs are summed over the stages (an all-reduce), and so are their gradients on the way back.

With Explicit mesh axes the pipeline's shard_map closes every other axis: what enters it, each stage's
weights and the microbatches (with the buffers the remat keeps of them: the outputs of every saved step), is
gathered whole over those axes once per step in each pass (the microbatches in a CPU program only),
besides the gathers each layer makes inside;
and the logits' gradient, split over the stages outside, is gathered over them to meet the replicated
output. With Auto axes those dimensions stay open and none of this moves.
"""

from __future__ import annotations

import math

from shardscope.case.resolve import Case
from shardscope.case.rules import entry_axes
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
    send = Cause(tensors=(), consumer=f"{module}/pipeline", line=None, rules=())
    micro = (micro_tokens, model.embed_dim)
    # The forward send is a hand-off: the next step's layers all wait for it. The backward send overlaps the
    # recomputed forward pass of the step it arrives in, which does not need it.
    rows = [
        collective_row(
            "collective-permute", stages, micro, dtype, p, module, send, trips=staged.loop_trips, shift=1, handoff=h
        )
        for p, h in (("forward", True), ("backward", False))
    ]
    # A device's tokens with the stage split undone: what the edge gathers and the output sum adds.
    edge = (tokens * math.prod(sizes[a] for a in stages), model.embed_dim)
    cause = Cause(tensors=(), consumer=f"{module}/pipeline_edge", line=None, rules=())
    explicit = plan.case.axis_types == EXPLICIT
    # With Explicit axes the outputs leave the shard_map whole over the closed axes, and are summed so.
    outputs = (case.global_batch * model.seq_len, model.embed_dim) if explicit else edge
    rows += [
        collective_row("all-gather", stages, edge, dtype, "forward", module, cause),
        collective_row("all-reduce", stages, outputs, dtype, "forward", module, cause),
        collective_row("all-reduce", stages, edge, dtype, "backward", module, cause),
    ]
    if not explicit:
        return tuple(rows)
    rows.append(collective_row("all-gather", stages, (edge[0], model.vocab_size), dtype, "backward", module, cause))
    closed = in_mesh_order(plan, set(batch) - set(stages))
    # A TPU program keeps the microbatches split at the edge (seed 003's explicit compiles for v5p-8, with
    # and without ZeRO-1 or the weights gathered once, have none of these gathers); a CPU program gathers them.
    if closed and dict(plan.provenance).get("backend") != "tpu":
        # The microbatches, the outputs buffer, and the outputs the remat keeps of every saved step (one per
        # round of a circular schedule, else one per iteration).
        saved = pipeline.repeats if pipeline.repeats > 1 else staged.loop_trips
        whole = (case.global_batch * model.seq_len, model.embed_dim)
        for pass_, copies in (("forward", 2 + saved), ("backward", 2)):
            shape = (copies * whole[0], whole[1])
            rows.append(collective_row("all-gather", closed, shape, dtype, pass_, module, cause))
    for weight in every:
        if weight.stack_axes:
            rows += _weight_edge(plan, weight, sizes, (*pipeline.gathered_once, *zero1_axes(plan, case)))
    return tuple(rows)


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
