"""Plans and explanations as rich renderables for the terminal (the CLI prints them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shardscope.case.rules import DimDecision, Rule
from shardscope.case.topology import mesh_label
from shardscope.plan.document import Plan
from shardscope.plan.records import CollectiveRow, axes_with_marks
from shardscope.plan.totals import bytes_by_kind, traffic_by_rule, traffic_totals
from shardscope.plan.units import human_bytes, human_seconds
from shardscope.report.estimate_terminal import estimate_renderable
from shardscope.report.findings import findings_summary
from shardscope.report.layout import FitToWidth, column_widths, spec_text


def _totals_table(title: str, rows: Sequence[tuple[str, int]], total: int) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column("")
    table.add_column("bytes / device / step", justify="right")
    table.add_column("share", justify="right")
    for name, size in rows:
        share = f"{100 * size / total:.0f}%" if total else "-"
        table.add_row(name, human_bytes(size), share)
    return table


def collectives_table(rows: Sequence[CollectiveRow], title: str = "Collectives") -> FitToWidth:
    """Every collective row: op, axes, pass, source, shape, bytes, count, trips, total."""
    return FitToWidth(lambda width: _collectives_table(rows, title, width))


def _collectives_table(rows: Sequence[CollectiveRow], title: str, width: int) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    fixed = {"op": 18, "pass": 9, "bytes": 10, "count": 5, "trips": 5, "total": 10}
    caused = any(row.cause is not None for row in rows)
    shares = {"axes": 2, "source": 4, "dtype[shape]": 2} | ({"rule (why)": 3} if caused else {})
    widths = column_widths(width, fixed, shares)
    order = ("op", "axes", "pass", "source", "dtype[shape]", "bytes", "count", "trips", "total", "rule (why)")
    columns = [c for c in order if c in widths]
    for column in columns:
        right = column in ("bytes", "count", "trips", "total")
        table.add_column(column, justify="right" if right else "left", overflow="fold", width=widths[column])
    for row in rows:
        shape = f"{row.dtype}[{','.join(map(str, row.shape))}]"
        axes = axes_with_marks(row)
        trips = "?" if row.loop_trips is None else str(row.loop_trips)
        table.add_row(
            row.op,
            axes,
            row.pass_,
            row.source or "-",
            shape,
            human_bytes(row.bytes),
            str(row.count),
            trips,
            human_bytes(row.traffic),
            *([row.cause.rules_text if row.cause else "-"] if caused else []),
        )
    return table


def traffic_tables(rows: Sequence[CollectiveRow]) -> Group:
    """Traffic per mesh axis, per op and per pass."""
    totals = traffic_totals(rows)
    parts: list = [
        _totals_table("Traffic per mesh axis", totals.by_axes, totals.total),
        _totals_table("Traffic per op", totals.by_op, totals.total),
        _totals_table("Traffic per pass", totals.by_pass, totals.total),
        Text(f"total {human_bytes(totals.total)} per device per step"),
    ]
    by_rule = traffic_by_rule(rows)
    if by_rule:
        parts.insert(3, _totals_table("Traffic per rule (why it moves)", by_rule, totals.total))
    if totals.unknown_trip_rows:
        parts.append(Text(f"{totals.unknown_trip_rows} row(s) inside loops of unknown trip count are not counted"))
    return Group(*parts)


def plan_header(plan: Plan) -> Text:
    """One line: model under preset on topology, mesh, axis types."""
    case = plan.case
    return Text.assemble(
        (f"{case.model}", "bold"),
        " under ",
        (case.preset, "bold"),
        f" on {case.topology}  mesh {mesh_label(case.mesh)}  axes {case.axis_types}",
    )


def plan_summary(plan: Plan) -> Group:
    """The `dump` summary: case, tensors per kind, memory, collective traffic, and lint findings."""
    summary = _plan_summary(plan)
    if not plan.findings:
        return summary

    return Group(summary, Text(""), findings_summary(plan.findings))


def _plan_summary(plan: Plan) -> Group:
    header = plan_header(plan)
    kinds = Table(title="Tensors", title_justify="left", show_edge=False)
    kinds.add_column("kind")
    kinds.add_column("count", justify="right")
    kinds.add_column("bytes / device", justify="right")
    for kind, count, size in bytes_by_kind(plan):
        kinds.add_row(kind, str(count), human_bytes(size))
    parts: list = [header, Text(""), kinds, Text("")]
    if not plan.holds("collectives"):
        parts.append(Text("tensors only (no compile): no collectives or memory"))
    else:
        memory = Table(title="Memory (compiler)", title_justify="left", show_edge=False)
        memory.add_column("")
        memory.add_column("bytes / device", justify="right")
        for name, size in plan.memory:
            memory.add_row(name.removesuffix("_bytes"), human_bytes(size))
        parts += [memory, Text(""), traffic_tables(plan.collectives)]
    if plan.estimate is not None:
        parts += [Text(""), estimate_renderable(plan.estimate)]
    unknown = dict(plan.compute).get("unknown_computations", 0)
    if unknown:
        # E.g. a Pallas kernel run in interpret mode on the CPU route (MaxText's grouped matmuls): its tiles
        # loop a number of times only the data decides.
        parts.append(
            Text(
                f"note: compute is a floor: {unknown} computations run a number of times the program does not "
                "say (a loop whose trips its data decides), and their work is left out",
                "yellow",
            )
        )
    return Group(*parts)


def explain_renderable(
    logical: Sequence[str | None], decisions: Sequence[DimDecision], rules: Sequence[Rule], notes: Sequence[str]
) -> Group:
    """`explain`: the spec, then per dimension the deciding rule and every skipped one."""
    spec = spec_text([d.spec for d in decisions])
    table = Table(show_edge=False)
    for column in ("dim", "logical", "physical", "decided by"):
        table.add_column(column)
    for dim, decision in enumerate(decisions):
        if decision.rule_index is None:
            why = "no rule applied → replicated" if decision.logical else "unnamed dimension"
        else:
            why = f"rule {decision.rule_index} {_rule_text(rules[decision.rule_index])}"
        table.add_row(str(dim), str(decision.logical), repr(decision.spec), why)
        for skip in decision.skipped:
            table.add_row(
                "",
                "",
                "",
                Text(f"  skipped rule {skip.rule_index} {_rule_text(rules[skip.rule_index])}: {skip.reason}", "dim"),
            )
    parts: list = [Text.assemble(("spec ", "bold"), spec), table]
    parts += [Text(f"note: {note}", "yellow") for note in notes]
    return Group(*parts)


def _rule_text(rule: Rule) -> str:
    logical, axes = rule
    return f"[{logical}, {list(axes)}]"


# Columns of pandas tables that hold bytes or fractions, shown as "1.5 MiB" and "25%".
_BYTE_COLUMNS = frozenset(
    ("traffic", "bytes", "bytes_per_device", "bytes_before", "bytes_after", "traffic_before", "traffic_after")
)


def frame_table(frame: Any, title: str = "") -> FitToWidth:
    """A pandas DataFrame as a terminal table: bytes in human units, shares as percentages, paths folded."""

    def cell(column: str, value: Any) -> str:
        if value is None or (isinstance(value, float) and value != value):
            return "-"
        if column in _BYTE_COLUMNS:
            return human_bytes(int(value))
        if column == "time_s":
            return human_seconds(float(value))
        if column == "share":
            return f"{100 * float(value):.0f}%"
        if isinstance(value, tuple):
            return "(" + ", ".join("-" if v is None else str(v) for v in value) + ")"
        return str(value)

    def build(width: int) -> Table:
        table = Table(title=title or None, title_justify="left", show_edge=False)
        for column in frame.columns:
            numeric = column in _BYTE_COLUMNS or column in ("share", "rows", "count", "loop_trips", "time_s")
            table.add_column(str(column), justify="right" if numeric else "left", overflow="fold")
        for record in frame.itertuples(index=False):
            table.add_row(*(cell(str(c), v) for c, v in zip(frame.columns, record, strict=True)))
        return table

    return FitToWidth(build)
