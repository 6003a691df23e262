"""Plans and explanations as rich renderables for the terminal (the CLI prints them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from shardscope.plan import CollectiveRow, Plan
from shardscope.rules import DimDecision, Rule, SpecEntry
from shardscope.summary import axes_label, bytes_by_kind, human_bytes, traffic_totals
from shardscope.topology import mesh_label


class FitToWidth:
    """A table built for the width it is rendered in: column minimums scale with the terminal, so long
    paths fold inside their cells on a narrow terminal and no row runs past its edge."""

    def __init__(self, build: Callable[[int], Table]) -> None:
        self._build = build

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._build(options.max_width)


def column_widths(width: int, fixed: Mapping[str, int], shares: Mapping[str, float]) -> dict[str, int]:
    """Exact column widths for a table of `width` cells (no edge, one cell of padding each side, one
    separator between columns): `fixed` columns get their width, the rest shares what is left."""
    columns = len(fixed) + len(shares)
    left = width - sum(fixed.values()) - 3 * columns + 1
    total = sum(shares.values())
    flexible = {name: max(6, int(left * share / total)) for name, share in shares.items()}
    return dict(fixed) | flexible


def spec_text(spec: Sequence[SpecEntry]) -> str:
    """A spec as users read PartitionSpecs: P(('data', 'fsdp'), 'expert', None)."""
    parts = []
    for entry in spec:
        if isinstance(entry, tuple):
            parts.append("(" + ", ".join(repr(a) for a in entry) + ")")
        else:
            parts.append(repr(entry))
    return "P(" + ", ".join(parts) + ")"


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
    widths = column_widths(width, fixed, {"axes": 2, "source": 4, "dtype[shape]": 2})
    for column in ("op", "axes", "pass", "source", "dtype[shape]", "bytes", "count", "trips", "total"):
        right = column in ("bytes", "count", "trips", "total")
        table.add_column(column, justify="right" if right else "left", overflow="fold", width=widths[column])
    for row in rows:
        shape = f"{row.dtype}[{','.join(map(str, row.shape))}]"
        axes = axes_label(row) + (f" shift {row.shift:+d}" if row.shift is not None else "")
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
    from shardscope.report.findings import findings_summary

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
        from shardscope.report.estimate_terminal import estimate_renderable

        parts += [Text(""), estimate_renderable(plan.estimate)]
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
            from shardscope.report.estimate_text import human_seconds

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
