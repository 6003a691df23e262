"""Lints of the compiled step: expert weights gathered over their expert-parallel axes inside the layer loop,
collectives over the cross-slice axis inside it, and a plan that does not fit the target's HBM (a TPU's or a
GPU's)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator

from shardscope.case.rules import entry_axes, explain_logical
from shardscope.case.topology import DCN_AXIS, dcn_axes_of
from shardscope.cost.gpu import gpu_memory
from shardscope.cost.memory import memory_need
from shardscope.lint.context import LintContext, axes_text, rule_subject
from shardscope.plan.findings import Finding
from shardscope.plan.records import CollectiveRow, TensorRecord, axes_label, is_stack_name
from shardscope.plan.units import human_bytes

EXPERT_NAME = "exp"
# MaxText's MoE gathers its expert weights over FSDP once per layer by design (it places them on their
# spec with `fsdp` removed): that gather is not expert parallelism being undone.
FSDP_AXIS = "fsdp"


def row_subject(row: CollectiveRow) -> str:
    """A collective row as findings name it: "all-gather over expert float32[1,8,32,64] forward at decoder"."""
    shape = ",".join(map(str, row.shape))
    return f"{row.op} over {axes_label(row)} {row.dtype}[{shape}] {row.pass_} at {row.source or '(top level)'}"


def in_loop(row: CollectiveRow) -> bool:
    """Whether a row runs inside a loop of more than one trip (or of an unknown count)."""
    return row.loop_trips is None or row.loop_trips > 1


def _expert_weights(ctx: LintContext) -> Iterator[tuple[str, TensorRecord, int, int, tuple[str, ...]]]:
    """(path, record, expert dim, layer dim, expert-parallel axes) of each scanned expert weight."""
    for path, tensor in ctx.tensors_of("param"):
        logical = tensor.logical or ()
        if EXPERT_NAME not in logical:
            continue
        layer_dims = [d for d, name in enumerate(logical) if is_stack_name(name)]
        if len(layer_dims) != 1:
            continue
        expert_dim = logical.index(EXPERT_NAME)
        ep = tuple(a for a in entry_axes(tensor.spec[expert_dim]) if a != FSDP_AXIS and ctx.size(a) > 1)
        if ep:
            yield path, tensor, expert_dim, layer_dims[0], ep


def _gathers_weight(row: CollectiveRow, tensor: TensorRecord, expert_dim: int, layer_dim: int) -> bool:
    """Whether the row's result is one layer's slice of the weight with more experts than a shard holds.

    A scanned weight is sliced per layer, so the gathered value keeps a dimension of 1 where the layer was
    (the scan moves it first); its other dimensions keep the weight's order and divide its sizes.
    """
    if len(row.shape) != len(tensor.shape) or 1 not in row.shape:
        return False
    rest = list(row.shape)
    rest.remove(1)
    sizes = [s for d, s in enumerate(tensor.shape) if d != layer_dim]
    local = [s for d, s in enumerate(tensor.shard_shape) if d != layer_dim]
    at = expert_dim - (expert_dim > layer_dim)
    return all(size % r == 0 for r, size in zip(rest, sizes, strict=True)) and rest[at] > local[at]


def _placement_note(ctx: LintContext, ep: tuple[str, ...]) -> str:
    """How the model places expert weights for its computation, when that drops expert-parallel axes."""
    notes = []
    for axes in sorted(ctx.resolved, key=repr):
        if EXPERT_NAME not in axes or any(t.logical == axes for t in ctx.tensors.values()):
            continue
        decisions = explain_logical(axes, ctx.rules)
        kept = decisions[axes.index(EXPERT_NAME)].mesh_axes
        lost = [a for a in ep if a not in kept]
        for axis in lost:
            taker = next((d for d in decisions if axis in d.mesh_axes), None)
            why = ""
            if taker is not None and taker.rule_index is not None:
                why = f": rule {rule_subject(taker.rule_index, ctx.rules[taker.rule_index])} takes {axis!r}"
            notes.append(f"the MoE places them on {list(axes)} without {axis!r}{why}")
    return "; ".join(dict.fromkeys(notes))


def check_expert_gathers(ctx: LintContext) -> Iterator[Finding]:
    """`expert-gather-in-loop`: expert weights all-gathered over expert-parallel axes inside the layer loop."""
    if not ctx.plan.holds("collectives"):
        return
    weights = list(_expert_weights(ctx))
    for row in ctx.plan.collectives:
        if not row.op.startswith("all-gather") or not in_loop(row) or not row.axes:
            continue
        matched = [
            (path, ep)
            for path, tensor, expert_dim, layer_dim, ep in weights
            if set(row.axes) & set(ep) and _gathers_weight(row, tensor, expert_dim, layer_dim)
        ]
        if not matched:
            continue
        ep = tuple(dict.fromkeys(a for _, axes in matched for a in axes if a in row.axes))
        names = ", ".join(sorted({path.rsplit("/", 1)[-1] for path, _ in matched}))
        note = _placement_note(ctx, ep)
        trips = "an unknown number of" if row.loop_trips is None else str(row.loop_trips)
        yield Finding(
            "expert-gather-in-loop",
            "warning",
            row_subject(row),
            f"expert weights ({names}, sharded over {axes_text(ep)} by their `exp` rule) are gathered over "
            f"{axes_text(ep)} in each of {trips} layer iterations ({human_bytes(row.bytes)} × {row.count})"
            + (f"; {note}" if note else ""),
            f"keep {axes_text(ep)} on the expert dimension where the MoE places its weights (the rules for "
            "mlp_no_fsdp / mlp_moe / embed_moe must not take it from exp)",
        )


def check_dcn_collectives(ctx: LintContext) -> Iterator[Finding]:
    """`dcn-collective-in-loop`: with several slices, collectives over the axis that spans them (`data` unless
    the case names another) inside the layer loop, one finding per (op, axes, pass, source)."""
    spanning = dcn_axes_of(ctx.plan.case.overrides)
    across = "+".join(spanning)
    # A GPU cluster's rows say which network they cross: `network-collective-in-loop` reads that instead.
    if ctx.slices <= 1 or ctx.cluster is not None or not ctx.plan.holds("collectives"):
        return
    groups: dict[tuple[str, tuple[str, ...], str, str], list[CollectiveRow]] = defaultdict(list)
    for row in ctx.plan.collectives:
        if row.axes and any(axis in row.axes for axis in spanning) and in_loop(row):
            groups[(row.op, row.axes, row.pass_, row.source)].append(row)
    for (op, axes, pass_, source), rows in sorted(groups.items()):
        per_iteration = sum(r.bytes * r.count for r in rows)
        trips = sorted({"?" if r.loop_trips is None else str(r.loop_trips) for r in rows})
        shapes = ", ".join(sorted({f"{r.dtype}[{','.join(map(str, r.shape))}]" for r in rows})[:3])
        more = "" if len(rows) <= 3 else f" and {len(rows) - 3} more"
        yield Finding(
            "dcn-collective-in-loop",
            "warning",
            f"{op} over {'+'.join(axes)} {pass_} at {source or '(top level)'}",
            f"crosses the data-center network ({across!r} spans {ctx.slices} slices) inside loops of "
            f"{'/'.join(trips)} trips: {len(rows)} rows ({shapes}{more}), {human_bytes(per_iteration)} per iteration",
            f"find the tensor sharded over {across!r} at {source or 'the top level'} and keep that axis to the batch"
            + ("" if across == DCN_AXIS else f", or join the slices over {DCN_AXIS!r} (dcn_data_parallelism)"),
        )


def check_hbm(ctx: LintContext) -> Iterator[Finding]:
    """`hbm-overflow`: the plan's per-device memory need exceeds the target hardware's HBM (a GPU's: as its
    compiler's figures add up)."""
    if ctx.gpu is not None and ctx.plan.memory:
        need, target, bound = gpu_memory(ctx.plan, ctx.gpu), ctx.gpu.name, " (the GPU compiler's figures)"
    elif ctx.hardware is not None:
        need, target = memory_need(ctx.plan, ctx.hardware), ctx.hardware.name
        estimated = " at least (estimated from the tensors: a lower bound)"
        bound = " (the TPU compiler's figures)" if need.exact else estimated
    else:
        return
    if need.fits:
        return
    largest = sorted(need.categories, key=lambda item: -item[1])[:3]
    parts = ", ".join(f"{name} {human_bytes(size)}" for name, size in largest)
    yield Finding(
        "hbm-overflow",
        "error",
        f"HBM per device on {target}",
        f"needs {human_bytes(need.total)}{bound} of {human_bytes(need.capacity)}: over by "
        f"{human_bytes(need.over)} (largest: {parts})",
        "shard more (FSDP over more devices), lower --set model.per_device_batch=…, or use more devices",
    )


def compile_refusal(ctx: LintContext, message: str) -> Finding:
    """`hbm-overflow` from the compiler's own refusal to fit the step in device memory."""
    devices = math.prod(size for _, size in ctx.plan.case.mesh)
    compiler = "GPU" if ctx.cluster is not None else "TPU"
    return Finding(
        "hbm-overflow",
        "error",
        f"HBM per device on {ctx.plan.case.topology}",
        f"the {compiler} compiler cannot fit the step on {devices} devices: {message}",
        "shard more (FSDP over more devices), lower --set model.per_device_batch=…, or use more devices",
    )
