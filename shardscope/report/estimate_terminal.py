"""An estimate in the terminal: time per mesh axis, op and pass, the step's bounds, and HBM against capacity."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shardscope.plan.estimate import Estimate
from shardscope.plan.units import human_bytes, human_seconds
from shardscope.report.estimate_text import (
    compute_label,
    efficiency_label,
    memory_source_label,
    memory_verdict,
    step_label,
    target_label,
)


def _time_section(table: Table, title: str, rows: Sequence[tuple[str, float]], total: float) -> None:
    for index, (name, seconds) in enumerate(sorted(rows, key=lambda r: -r[1])):
        share = f"{100 * seconds / total:.0f}%" if total else "-"
        table.add_row(title if index == 0 else "", name, human_seconds(seconds), share)
    table.add_section()


def time_table(estimate: Estimate) -> Table:
    """Communication time per mesh axis, per op and per pass (each section sums to the total)."""
    table = Table(title="Communication time", title_justify="left", show_edge=False)
    table.add_column("by")
    table.add_column("")
    table.add_column("time / step", justify="right")
    table.add_column("share", justify="right")
    total = estimate.communication
    _time_section(table, "mesh axis", estimate.by_axes, total)
    _time_section(table, "op", estimate.by_op, total)
    _time_section(table, "pass", estimate.by_pass, total)
    return table


def memory_table(estimate: Estimate) -> Table:
    """HBM need per device by category, with the total and the capacity."""
    memory = estimate.memory
    table = Table(title="HBM per device", title_justify="left", show_edge=False)
    table.add_column("")
    table.add_column("bytes / device", justify="right")
    for name, size in memory.categories:
        table.add_row(name, human_bytes(size))
    table.add_section()
    table.add_row("total", human_bytes(memory.total))
    table.add_row("capacity", human_bytes(memory.capacity))
    return table


def estimate_renderable(estimate: Estimate) -> Group:
    """The cost part of the `dump` summary."""
    lines: list = [
        Text.assemble(("Estimate on ", "bold"), (target_label(estimate), "bold"), f"  {efficiency_label(estimate)}"),
    ]
    if not estimate.rows and estimate.compute.flops is None:
        # A tensors-only plan: nothing compiled, so no collectives or work to time; memory is still known.
        lines.append(Text("step time unknown: no compiled step (tensors only); HBM need below", "dim"))
    else:
        lines += [
            time_table(estimate),
            Text.assemble(("communication ", "bold"), human_seconds(estimate.communication)),
            Text.assemble(("compute ", "bold"), compute_label(estimate)),
            Text.assemble(("step ", "bold"), step_label(estimate)),
        ]
        if estimate.expected_method:
            lines.append(Text(f"expected: {estimate.expected_method}", "dim"))
    if estimate.unpriced_rows:
        lines.append(Text(f"{estimate.unpriced_rows} collective row(s) not priced (see the plan JSON)", "yellow"))
    if estimate.cross_slice:
        lines.append(Text(f"{len(estimate.cross_slice)} cross-slice row(s) inferred from parameter shardings"))
    verdict = memory_verdict(estimate)
    lines += [
        Text(""),
        memory_table(estimate),
        Text.assemble(
            ("HBM ", "bold"),
            (verdict, "green" if estimate.memory.fits else "bold red"),
            f"  ({memory_source_label(estimate)})",
        ),
    ]
    return Group(*lines)
