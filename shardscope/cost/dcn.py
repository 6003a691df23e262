"""Traffic between slices that a per-slice plan does not show, inferred from its tensors.

A program for several slices is compiled per slice (`shardscope.extract.slice_mesh`): its collectives
number one slice's devices, and what crosses slices travels as host transfers the plan does not list.
What must cross is known from the shardings: one mesh axis spans the slices (`data`, unless the case
names another: `dcn_axis`), so every parameter replicated over it has its gradient summed across slices
(an all-reduce of its per-device bytes), and a parameter sharded over it is gathered across slices for the
forward pass and its gradient reduce-scattered back (rematerialised re-gathers are not counted: a lower
bound).
"""

from __future__ import annotations

from collections import defaultdict

from shardscope.case.topology import dcn_axis_of
from shardscope.plan.document import Plan
from shardscope.plan.records import CollectiveRow

SOURCE = "(cross-slice, inferred from parameter shardings)"


def _mentions(spec: tuple, axis: str) -> bool:
    return any(entry == axis or (isinstance(entry, tuple) and axis in entry) for entry in spec)


def cross_slice_rows(plan: Plan, slices: int) -> tuple[CollectiveRow, ...]:
    """Collective rows over the axis spanning `slices` slices, one per (op, dtype), in a fixed order.

    Bytes follow the plan's convention (full buffer per device): a gradient all-reduce moves the
    parameter's per-device bytes; a cross-slice gather's result is `slices` times them.
    """
    if slices <= 1:
        return ()
    across = dcn_axis_of(plan.case.overrides)
    sums: dict[tuple[str, str, str], int] = defaultdict(int)
    for _, tensor in plan.tensors:
        if tensor.kind != "param" or tensor.bytes_per_device == 0:
            continue
        if _mentions(tensor.spec, across):
            sums[("all-gather", tensor.dtype, "forward")] += tensor.bytes_per_device * slices
            sums[("reduce-scatter", tensor.dtype, "backward")] += tensor.bytes_per_device * slices
        else:
            sums[("all-reduce", tensor.dtype, "backward")] += tensor.bytes_per_device
    return tuple(
        CollectiveRow(
            op=op,
            axes=(across,),
            dtype=dtype,
            shape=(),
            bytes=nbytes,
            count=1,
            loop_trips=1,
            pass_=pass_,
            source=SOURCE,
        )
        for (op, dtype, pass_), nbytes in sorted(sums.items())
    )
