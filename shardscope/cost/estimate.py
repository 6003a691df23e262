"""A plan priced on a target TPU: time per collective row and per axis/op/pass, compute, step-time bounds
and memory against capacity (the plan's `estimate` section; ARCHITECTURE.md).

Pure: a Plan, a Hardware record and a Layout in, a frozen `Estimate` out. Rows are priced as the plan
records them (per device, × count × loop trips); rows whose groups match no mesh axes, whose trip count
is unknown or whose op has no model get no time and are counted as unpriced, never as zero.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Sequence

from shardscope.case.hardware import Hardware, HardwareError, table_source
from shardscope.cost.collective import PRICED_OPS, CollectiveTime, collective_time
from shardscope.cost.compute import compute_time
from shardscope.cost.dcn import cross_slice_rows
from shardscope.cost.layout import SLICE, Layout
from shardscope.cost.memory import memory_need
from shardscope.cost.step import expected_step, host_seconds, per_op_compute, tpu_execution
from shardscope.hlo.profile import WorkBin
from shardscope.plan.cpu_only import cpu_only
from shardscope.plan.document import Plan
from shardscope.plan.estimate import PER_OP, Estimate, PricedRow, RowTime
from shardscope.plan.records import CollectiveRow, axes_label, expert_hidden_width, is_routed_expert, model_width

BUILT_IN_SOURCES = "Google Cloud TPU documentation; How to Scale Your Model, Parts 2-3"


def figures_source() -> str:
    """The table the figures came from (a table of one's own is named by its path)."""
    return f"{table_source()} (built-in figures: {BUILT_IN_SOURCES})"


def price_row(
    row: CollectiveRow,
    layout: Layout,
    hardware: Hardware,
    efficiency: float,
    within_slice: bool,
    cpu_program: bool = False,
) -> RowTime:
    """One plan row's time per step on this layout (`cpu_program`: a CPU compile's row the TPU program does
    not have, `plan.cpu_only`, takes no time)."""
    if cpu_program and cpu_only(row):
        return RowTime(0.0, 0.0, 0.0)
    if row.axes is None:
        return RowTime(None, 0.0, 0.0, "groups match no mesh axes")
    if row.op not in PRICED_OPS:
        return RowTime(None, 0.0, 0.0, f"no time model for {row.op}")
    # As the TPU runs it: a CPU program's row in the TPU's bytes, or moved out of its loop (`tpu_execution`).
    nbytes, trips = tpu_execution(row, cpu_program)
    one = collective_time(row.op, nbytes, layout.group(row.axes, within_slice), hardware, row.shift)
    if trips is None:
        return RowTime(None, one.latency, one.transfer, "unknown loop trip count")
    return RowTime(one.seconds(efficiency) * row.count * trips, one.latency, one.transfer)


def expert_width(plan: Plan) -> int:
    """The hidden width of the plan's routed experts (`plan.records.expert_hidden_width`); 0 without experts."""
    width = model_width(plan.tensors)
    for path, record in plan.tensors:
        if is_routed_expert(path, record):
            return expert_hidden_width(record, width)
    return 0


def price_cross_slice(row: CollectiveRow, layout: Layout, hardware: Hardware, efficiency: float) -> RowTime:
    """The DCN part of a cross-slice row. A gradient all-reduce of a parameter replicated over the axis: the
    per-slice program already sums it inside the slice, so only 1/n of the buffer (n = the axis's devices
    within a slice) crosses, per device. A gather or reduce-scatter of a parameter split over the axis: each
    device exchanges its own shard with its peers in the other slices, the whole row (the shard × slices)."""
    spans = layout.group(row.axes or ())
    inner = 1
    for span in spans:
        if span.dim != SLICE and row.op == "all-reduce":
            inner *= span.extent
    dcn = tuple(span for span in spans if span.dim == SLICE)
    one: CollectiveTime = collective_time(row.op, row.bytes / inner, dcn, hardware)
    return RowTime(one.seconds(efficiency) * row.count * (row.loop_trips or 1), one.latency, one.transfer)


def _totals(pairs: Iterable[tuple[CollectiveRow, RowTime]]) -> tuple[dict[str, float], ...]:
    by_axes: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    by_pass: dict[str, float] = defaultdict(float)
    for row, time in pairs:
        if time.seconds is None or row.axes == ():
            continue
        by_axes[axes_label(row)] += time.seconds
        by_op[row.op] += time.seconds
        by_pass[row.pass_] += time.seconds
    return by_axes, by_op, by_pass


def _check_layout(plan: Plan, layout: Layout, hardware: Hardware) -> None:
    if layout.hardware != hardware.name:
        raise HardwareError(f"layout is for {layout.hardware} but the hardware is {hardware.name}")
    mesh = dict(plan.case.mesh)
    laid = {axis.name: axis.size for axis in layout.axes}
    if mesh != laid:
        raise HardwareError(f"layout mesh {laid} is not the plan's mesh {mesh}")


def estimate_plan(
    plan: Plan,
    hardware: Hardware,
    layout: Layout,
    *,
    efficiency: float | None = None,
    flops: float | None = None,
    bytes_accessed: float | None = None,
    exact_memory: bool = True,
    work: Sequence[WorkBin] = (),
    route: str = "",
    cpu_program: bool = False,
) -> Estimate:
    """Prices a plan on `hardware` laid out as `layout`.

    Args:
      plan: any plan (CPU or TPU, compiled or tensors-only).
      hardware: the target generation (`load_hardware`).
      layout: the plan's mesh on that hardware (`layout_for` or `layout_from_mesh`).
      efficiency: fraction of modelled link bandwidth reached; default: the hardware table's.
      flops, bytes_accessed: per-device figures of the compiled step (the plan's `compute` section).
      exact_memory: whether a TPU plan's compiled memory figures describe this hardware (False when a plan
        compiled for one generation is priced on another: its need is then estimated from the tensors).
      work: the plan's work profile: with it, compute is priced op by op and `expected` overlaps per loop
        body; without it, there is no expected figure (the bounds remain).
      route: which compile the figures come from, for every label that prints them.
      cpu_program: the plan is a CPU compile's (its ops' bytes are priced as a TPU's would be, and the rows
        only a CPU compile has take no time).

    Raises:
      HardwareError: the layout is for another generation or mesh, or efficiency is not in (0, 1].
    """
    _check_layout(plan, layout, hardware)
    eff = hardware.efficiency if efficiency is None else float(efficiency)
    if not 0 < eff <= 1:
        raise HardwareError(f"efficiency must be in (0, 1], found {efficiency!r}")
    # A multi-slice plan is compiled per slice: its groups never leave a slice.
    within_slice = layout.slices > 1
    rows = tuple(price_row(row, layout, hardware, eff, within_slice, cpu_program) for row in plan.collectives)
    cross = tuple(
        PricedRow(row, price_cross_slice(row, layout, hardware, eff)) for row in cross_slice_rows(plan, layout.slices)
    )
    pairs = [*zip(plan.collectives, rows, strict=True), *((p.row, p.time) for p in cross)]
    by_axes, by_op, by_pass = _totals(pairs)
    compute = compute_time(hardware, flops, bytes_accessed)
    communication = sum(t.seconds for _, t in pairs if t.seconds is not None)
    width = expert_width(plan)
    expected, method = _expected(work, pairs, hardware, cpu_program, width)
    if work:
        compute = dataclasses.replace(compute, per_op_seconds=per_op_compute(work, hardware, cpu_program, width))
    host = sum(host_seconds(entry, hardware) for entry in work)
    return Estimate(
        hardware=hardware.name,
        slice_shape=layout.slice_shape,
        slices=layout.slices,
        layout_source=layout.source,
        efficiency=eff,
        efficiency_source="hardware table" if efficiency is None else "caller",
        figures_source=figures_source(),
        rows=rows,
        cross_slice=cross,
        by_axes=tuple(sorted(by_axes.items())),
        by_op=tuple(sorted(by_op.items())),
        by_pass=tuple(sorted(by_pass.items())),
        communication=communication,
        unpriced_rows=sum(1 for t in rows if t.seconds is None),
        compute=compute,
        memory=memory_need(plan, hardware, exact=exact_memory),
        expected=expected,
        expected_method=method,
        route=route,
        host_transfer=host,
    )


def _expected(
    work: Sequence[WorkBin],
    pairs: Sequence[tuple[CollectiveRow, RowTime]],
    hardware: Hardware,
    cpu_program: bool,
    width: int,
) -> tuple[float | None, str | None]:
    # Without a work profile (a plan saved before plans had one) there is no expected figure: the whole-step
    # totals priced at the calibrated rates would not lie between the bounds, which price them at peak, and
    # the constants were fitted per op. Every compiled plan has a profile now.
    if not work:
        return None, None
    return expected_step(work, pairs, hardware, cpu_program, width), PER_OP
