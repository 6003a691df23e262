"""Lints of a GPU cluster's compiled step: collectives of the layer loop that cross the network between NVLink
domains although their axes would fit inside one, and tensor-parallel groups split across domains.

Each collective row of a GPU plan says which network it crosses (`CollectiveRow.link`, read from its device
groups): NVLink inside a domain (an HGX host's 8 GPUs, a GB200 rack's 72), or the hosts' NICs, about 9×
slower per GPU on H100/H200/B200. Both checks read only those rows and the mesh.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator

from shardscope.case.topology import DCN_AXIS
from shardscope.lint.context import LintContext, axes_text
from shardscope.lint.step_checks import in_loop
from shardscope.plan.findings import Finding
from shardscope.plan.records import CollectiveRow
from shardscope.plan.units import human_bytes

NETWORK = "network"
# Mesh axes whose collectives sit on every layer's critical path (the partial sums of a split matmul): the
# axes tensor parallelism is laid on in MaxText's meshes.
TENSOR_PARALLEL_AXES = ("tensor", "tensor_transpose", "tensor_sequence")


def _group_size(ctx: LintContext, row: CollectiveRow) -> int:
    return math.prod(ctx.size(axis) for axis in row.axes or ())


def _gradient_sum(row: CollectiveRow) -> bool:
    """Data parallelism's gradient all-reduce: each weight's gradient crosses once per step wherever it is laid,
    whether the GPU compiler sums it layer by layer inside the loop (as it pipelines all-reduces) or after it."""
    return row.op == "all-reduce" and set(row.axes or ()) <= {DCN_AXIS}


def _network_rows(ctx: LintContext) -> Iterator[CollectiveRow]:
    if ctx.cluster is None or not ctx.plan.holds("collectives"):
        return
    yield from (row for row in ctx.plan.collectives if row.link == NETWORK and row.axes)


def check_network_collectives(ctx: LintContext) -> Iterator[Finding]:
    """`network-collective-in-loop`: on a GPU cluster, collectives inside the layer loop that cross the
    network over mesh axes whose devices would fit in one NVLink domain, one finding per (op, axes, pass,
    source). Tensor-parallel axes are left to `tensor-parallel-across-network`; data parallelism's gradient
    sum is not a placement choice."""
    if ctx.cluster is None:
        return
    domain = ctx.cluster.domain_gpus
    groups: dict[tuple[str, tuple[str, ...], str, str], list[CollectiveRow]] = defaultdict(list)
    for row in _network_rows(ctx):
        axes = row.axes or ()
        tensor_parallel = bool(set(axes) & set(TENSOR_PARALLEL_AXES))
        if in_loop(row) and _group_size(ctx, row) <= domain and not tensor_parallel and not _gradient_sum(row):
            groups[(row.op, axes, row.pass_, row.source)].append(row)
    for (op, axes, pass_, source), rows in sorted(groups.items()):
        per_iteration = sum(r.bytes * r.count for r in rows)
        trips = sorted({"?" if r.loop_trips is None else str(r.loop_trips) for r in rows})
        size = _group_size(ctx, rows[0])
        yield Finding(
            "network-collective-in-loop",
            "warning",
            f"{op} over {'+'.join(axes)} {pass_} at {source or '(top level)'}",
            f"crosses the network between NVLink domains inside loops of {'/'.join(trips)} trips "
            f"({len(rows)} rows, {human_bytes(per_iteration)} per iteration), although its {size} GPUs "
            f"would fit one domain of {domain}",
            f"lay {axes_text(axes)} inside the NVLink domain (MaxText's ici_*_parallelism) and put a batch axis "
            "across hosts (dcn_data_parallelism or dcn_fsdp_parallelism)",
        )


def check_tensor_parallel_across_network(ctx: LintContext) -> Iterator[Finding]:
    """`tensor-parallel-across-network`: on a GPU cluster, collectives over a tensor-parallel axis whose
    groups cross the network: the axis splits the NVLink domain's GPUs from their partners. One finding per
    set of axes."""
    if ctx.cluster is None:
        return
    domain = ctx.cluster.domain_gpus
    groups: dict[tuple[str, ...], list[CollectiveRow]] = defaultdict(list)
    for row in _network_rows(ctx):
        if set(row.axes or ()) & set(TENSOR_PARALLEL_AXES):
            groups[row.axes or ()].append(row)
    for axes, rows in sorted(groups.items()):
        size = _group_size(ctx, rows[0])
        traffic = [r.traffic for r in rows]
        total = None if None in traffic else sum(t or 0 for t in traffic)
        why = (
            f"{size} GPUs, more than one domain's {domain}"
            if size > domain
            else f"{size} GPUs laid across hosts, where one domain of {domain} would hold them"
        )
        yield Finding(
            "tensor-parallel-across-network",
            "warning",
            f"tensor parallelism over {'+'.join(axes)}",
            f"{len(rows)} collective rows over {axes_text(axes)} cross the network between NVLink domains "
            f"({why}): {human_bytes(total) if total is not None else 'an unknown amount'} per device per step "
            "on every layer's critical path",
            f"keep {axes_text(axes)} within one NVLink domain (at most {domain} GPUs, on ici_*_parallelism) and "
            "split across hosts over data or fsdp instead",
        )
