"""A plan's traffic grouped by the network it crosses, so that a TPU plan and a GPU plan of one case compare:
inside a TPU slice (ICI) or an NVLink domain, and between slices (DCN) or domains (the network).

A GPU plan's rows say their link. A TPU program over several slices is compiled per slice: its rows are a
slice's (ICI), and what crosses slices is inferred from the parameters' shardings (`cost.dcn`, a floor). A
CPU plan's fake devices cross no network: it has no such grouping.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardscope.case.gpu import is_gpu_name
from shardscope.cost.dcn import cross_slice_rows
from shardscope.errors import ShardscopeError
from shardscope.plan.document import Plan
from shardscope.plan.records import CollectiveRow

INSIDE, ACROSS = "inside", "across"
# Each platform's name for the two networks.
FABRICS = {"gpu": {INSIDE: "NVLink", ACROSS: "network"}, "tpu": {INSIDE: "ICI", ACROSS: "DCN"}}


def platform_of(plan: Plan) -> str:
    """ "gpu", "tpu" or "cpu": what the plan was compiled for, from its backend (its topology's name else)."""
    backend = dict(plan.provenance).get("backend")
    if backend in ("gpu", "tpu", "cpu"):
        return str(backend)
    return "gpu" if is_gpu_name(plan.case.topology) else "cpu" if plan.case.topology.startswith("cpu") else "tpu"


def _traffic(rows: Sequence[CollectiveRow]) -> int:
    return sum(row.traffic or 0 for row in rows if row.axes != ())


def traffic_by_network(plan: Plan) -> dict[str, int]:
    """Bytes per device per step inside and across (INSIDE, ACROSS); {} for a CPU plan or one that cannot
    say (a TPU topology this shardscope does not know)."""
    platform = platform_of(plan)
    if platform == "gpu":
        return {
            INSIDE: _traffic([row for row in plan.collectives if row.link == "nvlink"]),
            ACROSS: _traffic([row for row in plan.collectives if row.link == "network"]),
        }
    if platform != "tpu":
        return {}
    from shardscope.case.topology import get_topology  # lazy: a topology's name is read only for TPU plans

    try:
        slices = get_topology(plan.case.topology).slices
    except ShardscopeError:
        return {}
    return {INSIDE: _traffic(plan.collectives), ACROSS: _traffic(cross_slice_rows(plan, slices))}


def paired_networks(old: Plan, new: Plan) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """Both plans' traffic per network, named so the rows pair: "ICI → NVLink" and "DCN → network" for a
    TPU plan against a GPU plan, "NVLink" and "network" for two GPU plans. Empty unless a side is a GPU
    plan and neither is a CPU plan (a diff of TPU plans keeps its tables as they were)."""
    platforms = [platform_of(old), platform_of(new)]
    if "gpu" not in platforms or "cpu" in platforms:
        return (), ()
    sides = [traffic_by_network(old), traffic_by_network(new)]
    if not all(sides):
        return (), ()
    names = {}
    for where in (INSIDE, ACROSS):
        fabrics = list(dict.fromkeys(FABRICS[platform][where] for platform in platforms))
        names[where] = " → ".join(fabrics)
    before, after = ((tuple((names[where], side[where]) for where in (INSIDE, ACROSS))) for side in sides)
    return before, after
