"""A plan diff for the terminal (rich renderables the CLI prints), and the text helpers every diff
report shares, so that the terminal, HTML and Markdown spell a change the same way."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from shardscope.case.rules import SpecEntry
from shardscope.case.topology import mesh_label
from shardscope.diff.changes import Change, CollectiveSide, PlanDiff
from shardscope.diff.grouping import TensorGroup, group_tensor_changes, unit_axes
from shardscope.diff.kinds import COLLECTIVE_CHANGE_KINDS, FINDING_CHANGE_KINDS, TENSOR_CHANGE_KINDS
from shardscope.plan.estimate import Estimate
from shardscope.plan.records import CaseRecord
from shardscope.plan.units import human_bytes, human_seconds, signed_bytes, signed_seconds
from shardscope.report.estimate_text import cost_headline, cost_rows, memory_headline, target_label
from shardscope.report.findings import finding_changes_table
from shardscope.report.layout import FitToWidth, column_widths, elide_middle, spec_text
from shardscope.report.rule_changes import explained_groups

# One headline line: a name and its value on each side (None where that side lacks it).
HeadlineRow = tuple[str, int | None, int | None]

COLLECTIVE_MARKS = {"collective_removed": "−", "collective_added": "+", "collective_changed": "~"}
TENSOR_MARKS = {"tensor_removed": "−", "tensor_added": "+", "tensor_changed": "~", "spec_changed": "~"}


@dataclass(frozen=True)
class HeadlineSection:
    """A titled group of before/after totals (bytes per device; per step for traffic)."""

    title: str
    rows: tuple[HeadlineRow, ...]


def paired(before: Iterable[tuple[str, int]], after: Iterable[tuple[str, int]]) -> tuple[HeadlineRow, ...]:
    """Aligns two (name, value) lists by name, in order of first appearance (old side first)."""
    old, new = dict(before), dict(after)
    names = list(old) + [n for n in new if n not in old]
    return tuple((name, old.get(name), new.get(name)) for name in names)


def headline_sections(diff: PlanDiff) -> tuple[HeadlineSection, ...]:
    """The totals a reviewer reads first: traffic per axis, op and pass; memory; tensor bytes per kind."""
    before, after = diff.totals_before, diff.totals_after
    traffic = (
        (
            *(
                (HeadlineSection("Traffic per network", paired(diff.networks_before, diff.networks_after)),)
                if diff.networks_before or diff.networks_after
                else ()
            ),
            HeadlineSection("Traffic per mesh axis", paired(before.by_axes, after.by_axes)),
            HeadlineSection("Traffic per op", paired(before.by_op, after.by_op)),
            HeadlineSection("Traffic per pass", paired(before.by_pass, after.by_pass)),
        )
        if diff.traffic_compared
        else ()
    )
    memory = (
        (
            HeadlineSection(
                "Memory per device",
                paired(
                    [(name.removesuffix("_bytes"), size) for name, size in diff.memory_before],
                    [(name.removesuffix("_bytes"), size) for name, size in diff.memory_after],
                ),
            ),
        )
        if diff.memory_before or diff.memory_after  # the compiler's figures: none without a compile
        else ()
    )
    return (
        *traffic,
        *memory,
        HeadlineSection(
            "Tensor bytes per device",
            paired([(k, b) for k, _, b in diff.kinds_before], [(k, b) for k, _, b in diff.kinds_after]),
        ),
    )


def delta_text(before: int | None, after: int | None) -> str:
    """ "+12.0 KiB (+25%)", "new", "gone", or "" when equal."""
    if before is None and after is None:
        return ""
    if before is None:
        return "new"
    if after is None:
        return "gone"
    if before == after:
        return ""
    percent = f" ({(after - before) / before:+.0%})".replace("-", "−") if before else ""
    return signed_bytes(after - before) + percent


def trend(before: int | None, after: int | None) -> str:
    """ "up", "down" or "same": more bytes (traffic, memory) is the direction a reviewer worries about."""
    old, new = before or 0, after or 0
    return "up" if new > old else "down" if new < old else "same"


def entry_text(entry: SpecEntry) -> str:
    """One spec entry as in a PartitionSpec: None, 'fsdp', ('data', 'fsdp')."""
    return spec_text([entry])[2:-1]


def case_title(case: CaseRecord) -> str:
    """deepseek-tiny · default · cpu-8."""
    return f"{case.model} · {case.preset} · {case.topology}"


def preset_origin(case: CaseRecord, holds: str = "") -> str:
    """Where a side's preset came from: "built-in", "file rules/ep-as-cp.yml", "MaxText's rule" or, for MaxText's
    own program, "MaxText's rules" (its base.yml, model and rule file merged, as its config merges them)."""
    if case.model.startswith("maxtext:"):
        return "MaxText's rules"
    if case.preset_source:
        return f"file {case.preset_source}"
    return "MaxText's rule" if holds.startswith("MaxText") else "built-in"


def case_line(case: CaseRecord, holds: str = "") -> str:
    """The full case header on one line (preset and where it came from, mesh in device order, overrides,
    and what the plan holds when told)."""
    overrides = " ".join(f"{k}={v}" for k, v in case.overrides)
    extra = f"  set {overrides}" if overrides else ""
    extra += f"  ({holds})" if holds else ""
    mesh = mesh_label(case.mesh)
    preset = f"{case.preset} ({preset_origin(case, holds)})"
    return f"{case.model} under {preset} on {case.topology}  mesh {mesh}  axes {case.axis_types}{extra}"


NOT_COMPILED = "traffic unknown: nothing compiled (a tensors-only plan)"


def traffic_line(diff: PlanDiff) -> str:
    """ "total traffic 1.2 MiB → 1.5 MiB per device per step (+25%)", or why there is none to compare."""
    if not diff.traffic_compared:
        return NOT_COMPILED
    before, after = diff.totals_before.total, diff.totals_after.total
    change = delta_text(before, after) or "unchanged"
    return f"total traffic {human_bytes(before)} → {human_bytes(after)} per device per step ({change})"


def verdict_text(diff: PlanDiff) -> tuple[str, bool]:
    """ "no changes", "12 changes (and 3 lint findings)", or "same placement and traffic: 21 lint findings
    changed"; and whether the plans differ in what they place and move (lint findings and the case header
    that names the sides are counted apart)."""
    if diff.same:
        return "no changes", False
    placement, findings = len(diff.placement_changes), len(diff.finding_changes)
    noun = f"{findings} lint finding{'' if findings == 1 else 's'}"
    if not placement:
        return f"same placement and traffic; {noun} changed" if findings else "same placement and traffic", False
    text = f"{placement} change{'' if placement == 1 else 's'}"
    return (f"{text} (and {noun})" if findings else text), True


def value_text(value: Any) -> str:
    """A plain change value for a table cell: dicts as k=v, lists as [a,b], None as "—"."""
    if value is None:
        return "—"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "{}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def dim_phrases(change: Change, unit: Collection[str] = ()) -> list[str]:
    """What changed in a tensor, one phrase per dimension or field: "dim 1 activation_length +expert".

    Axes in `unit` (size 1 on both sides, see `unit_axes`) are marked "(size 1)": they move no data.
    """

    def axis(sign: str, name: str) -> str:
        return f"{sign}{name}" + (" (size 1)" if name in unit else "")

    phrases = []
    for dim in change.dims:
        moved = [axis("+", a) for a in dim.axes_added] + [axis("−", a) for a in dim.axes_dropped]
        what = " ".join(moved) if moved else f"reordered {entry_text(dim.before)} → {entry_text(dim.after)}"
        phrases.append(f"dim {dim.dim} {dim.logical or '(unnamed)'} {what}")
    for field in change.fields:
        if field.field not in ("shard_shape", "bytes_per_device"):
            phrases.append(f"{field.field} {value_text(field.before)} → {value_text(field.after)}")
    return phrases


def tensor_bytes(change: Change) -> tuple[int | None, int | None]:
    """Bytes per device of a tensor change, before and after (None on an absent side)."""

    before, after = change.tensor_sides
    return (None if before is None else before.bytes_per_device, None if after is None else after.bytes_per_device)


def stat_text(change: Change, name: str) -> str:
    """A collective's count/bytes/loop_trips/traffic cell: "2 → 4" when it moved, else its value."""
    moved = {f.field: f for f in change.fields}
    if name in moved:
        return f"{_stat(name, moved[name].before)} → {_stat(name, moved[name].after)}"
    return _stat(name, getattr(change.collective, name))


def _stat(name: str, value: Any) -> str:
    if isinstance(value, list | tuple):
        return "/".join(_stat(name, v) for v in value)
    if name in ("bytes", "traffic"):
        return human_bytes(value)
    return "?" if value is None else str(value)


def collective_shape(row: CollectiveSide) -> str:
    """float32[64,32]."""
    return f"{row.dtype}[{','.join(map(str, row.shape))}]"


def collective_axes(row: CollectiveSide) -> str:
    """fsdp+expert, with the shift of a collective-permute."""
    shift = f" shift {row.shift:+d}" if row.shift is not None else ""
    return f"{row.axes_label}{shift}"


def summary_counts(diff: PlanDiff) -> list[str]:
    """One short phrase per kind of change: "72 tensor specs changed", "1 collective added", ..."""
    names = {
        "case": ("case field", "changed"),
        "extra_changed": ("extra plan field", "changed"),
        "memory_changed": ("memory field", "changed"),
        "compute_changed": ("compute figure", "changed"),
        "tensor_removed": ("tensor", "removed"),
        "tensor_added": ("tensor", "added"),
        "tensor_changed": ("tensor", "changed (shape, dtype or axes)"),
        "spec_changed": ("tensor spec", "changed"),
        "collective_removed": ("collective", "removed"),
        "collective_added": ("collective", "added"),
        "collective_changed": ("collective", "changed"),
        "finding_added": ("lint finding", "added"),
        "finding_resolved": ("lint finding", "resolved"),
        "finding_changed": ("lint finding", "changed"),
    }
    phrases = []
    for kind, (noun, verb) in names.items():
        count = len(diff.of_kind(kind))
        if count:
            phrases.append(f"{count} {noun}{'' if count == 1 else 's'} {verb}")
    return phrases


def _headline_table(section: HeadlineSection) -> Table:
    table = Table(title=section.title, title_justify="left", show_edge=False)
    for column in ("", "before", "after", "Δ"):
        table.add_column(column, justify="left" if not column else "right")
    for name, before, after in section.rows:
        style = {"up": "red", "down": "green", "same": "dim"}[trend(before, after)]
        table.add_row(name, human_bytes(before), human_bytes(after), Text(delta_text(before, after), style))
    return table


# Below this width the tables leave out their least needed columns rather than crop the rest.
WIDE = 120


def _tensor_table(groups: Sequence[TensorGroup], unit: Collection[str], width: int) -> Table:
    table = Table(title="Changed tensors", title_justify="left", show_edge=False)
    # Narrow terminals fold long paths and specs inside their cells; a row never runs past the edge.
    fixed = {"": 1, "bytes / device": 19} | ({"kind": 10} if width >= WIDE else {})
    widths = column_widths(width, fixed, {"tensor": 4, "what changed": 3, "spec before → after": 3})
    columns = [
        c for c in ("", "tensor", "kind", "what changed", "spec before → after", "bytes / device") if c in widths
    ]
    for column in columns:
        right = column == "bytes / device"
        table.add_column(column, justify="right" if right else "left", overflow="fold", width=widths[column])
    for group in groups:
        change = group.change
        path = Text(elide_middle(change.subject, widths["tensor"]))
        if group.mirrors:
            path.append(f"\n  + {len(group.mirrors)} mirrors (optimizer state, outputs)", "dim")
        specs = " → ".join(spec_text(s.spec) for s in change.tensor_sides if s is not None)
        before, after = tensor_bytes(change)
        sizes = " → ".join(human_bytes(b) for b in (before, after) if b is not None)
        style = {"up": "red", "down": "green", "same": ""}[trend(before, after)]
        cells: dict[str, RenderableType] = {
            "": TENSOR_MARKS[change.kind],
            "tensor": path,
            "kind": change.tensor.kind,
            "what changed": "\n".join(dim_phrases(change, unit)),
            "spec before → after": specs,
            "bytes / device": Text(sizes, style),
        }
        table.add_row(*(cells[column] for column in columns))
    return table


def _collective_table(changes: Sequence[Change], width: int) -> Table:
    table = Table(title="Collective changes", title_justify="left", show_edge=False)
    fixed = {"": 1, "op": 18, "pass": 9, "traffic": 19}
    if width >= WIDE:
        fixed |= {"count": 5, "bytes": 19, "trips": 5}  # on narrow terminals traffic (bytes × count × trips) says it
    widths = column_widths(width, fixed, {"axes": 2, "source": 4} | ({"dtype[shape]": 2} if width >= WIDE else {}))
    order = ("", "op", "axes", "pass", "source", "dtype[shape]", "count", "bytes", "trips", "traffic")
    columns = [c for c in order if c in widths]
    for column in columns:
        right = column in ("count", "bytes", "trips", "traffic")
        table.add_column(column, justify="right" if right else "left", overflow="fold", width=widths[column])
    style = {"collective_removed": "red", "collective_added": "green", "collective_changed": "yellow"}
    stats = {"count": "count", "bytes": "bytes", "trips": "loop_trips", "traffic": "traffic"}
    for change in changes:
        row = change.collective
        cells: dict[str, RenderableType] = {
            "": Text(COLLECTIVE_MARKS[change.kind], style[change.kind]),
            "op": row.op,
            "axes": collective_axes(row),
            "pass": row.pass_,
            "source": elide_middle(row.source or "(top level)", widths["source"]),
            "dtype[shape]": collective_shape(row),
            **{column: stat_text(change, name) for column, name in stats.items()},
        }
        table.add_row(*(cells[column] for column in columns))
    return table


def _targets(diff: PlanDiff, target: Estimate) -> str:
    """ "v5p 2x2x2, efficiency 0.82", or each side's when they were priced on different hardware (a TPU plan
    against a GPU plan)."""
    before, after = diff.cost_before, diff.cost_after
    if before is not None and after is not None and before.hardware != after.hardware:
        return " → ".join(f"{target_label(e)}, efficiency {e.efficiency:g}" for e in (before, after))
    return f"{target_label(target)}, efficiency {target.efficiency:g}"


def _cost_table(diff: PlanDiff, target: Estimate) -> Table:
    table = Table(
        title=f"Estimated time per step ({_targets(diff, target)})",
        title_justify="left",
        show_edge=False,
    )
    for column in ("by", "", "before", "after", "Δ"):
        table.add_column(column, justify="right" if column in ("before", "after", "Δ") else "left")
    section = None
    for where, name, before, after in cost_rows(diff.cost_before, diff.cost_after):
        if section is not None and where != section:
            table.add_section()
        label = where if where != section else ""
        section = where
        delta = "" if before is None or after is None else seconds_delta(before, after)
        style = {"up": "red", "down": "green", "same": "dim"}[trend_seconds(before, after)]
        table.add_row(label, name, human_seconds(before), human_seconds(after), Text(delta, style))
    return table


def seconds_delta(before: float, after: float) -> str:
    """ "+0.80 ms (+12%)", or "" when equal."""

    if before == after:
        return ""
    percent = f" ({(after - before) / before:+.0%})".replace("-", "−") if before else ""
    return signed_seconds(after - before) + percent


def trend_seconds(before: float | None, after: float | None) -> str:
    """ "up", "down" or "same": more time is what a reviewer worries about."""
    old, new = before or 0.0, after or 0.0
    return "up" if new > old * (1 + 1e-9) else "down" if new < old * (1 - 1e-9) else "same"


def cost_lines(diff: PlanDiff) -> list[str]:
    """The cost headline of a diff: Δ step (or communication) time and the HBM need, when both are priced."""

    lines = [cost_headline(diff.cost_before, diff.cost_after, diff.old_case.preset)]
    lines.append(memory_headline(diff.cost_before, diff.cost_after))
    return [line for line in lines if line is not None]


def _generic_table(title: str, changes: Sequence[Change]) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    for column in ("field", "before", "after"):
        table.add_column(column)
    for change in changes:
        table.add_row(change.subject, value_text(change.before), value_text(change.after))
    return table


def diff_renderable(diff: PlanDiff) -> Group:
    """The `diff` output: case, headline totals before → after, changed tensors, collective changes."""
    words, differ = verdict_text(diff)
    verdict = Text(words, "bold red" if differ else "bold green")
    parts: list[RenderableType] = [
        Text.assemble(("old ", "dim"), case_line(diff.old_case, diff.old_holds)),
        Text.assemble(("new ", "dim"), case_line(diff.new_case, diff.new_holds)),
        Text.assemble(verdict, ("  " + ", ".join(summary_counts(diff)), "")),
    ]
    parts += [Text(line, "bold") for line in cost_lines(diff)]
    for kind, title in (
        ("case", "Case"),
        ("extra_changed", "Extra plan fields"),
        ("compute_changed", "Compiled work per device"),
    ):
        if diff.of_kind(kind):
            parts += [Text(""), _generic_table(title, diff.of_kind(kind))]
    for section in headline_sections(diff):
        parts += [Text(""), _headline_table(section)]
    parts.append(Text(traffic_line(diff)))
    target = diff.cost_after or diff.cost_before
    if target is not None:
        parts += [Text(""), _cost_table(diff, target)]
    groups = group_tensor_changes(diff.of_kind(*TENSOR_CHANGE_KINDS))
    if groups:
        unit = unit_axes(diff.old_case, diff.new_case)
        parts += [Text(""), FitToWidth(lambda width: _tensor_table(groups, unit, width))]
    collectives = diff.of_kind(*COLLECTIVE_CHANGE_KINDS)
    if collectives:
        parts += [Text(""), FitToWidth(lambda width: _collective_table(collectives, width))]
    explained = explained_groups(diff)
    if explained:
        parts += [Text(""), Text("Why the collectives changed", "bold")]
        for group in explained:
            parts.append(Text.assemble((group.title, "bold" if group.is_rule else "yellow"), f"  {group.traffic}"))
            if group.placed:
                parts.append(Text(f"  {group.placed}", "dim"))
            style = {"−": "red", "+": "green", "~": "yellow"}
            parts += [
                Text.assemble(("  " + mark, style[mark]), f" {subject}  ", (delta, "bold"))
                for mark, subject, delta in group.rows
            ]
    findings = diff.of_kind(*FINDING_CHANGE_KINDS)
    if findings:
        parts += [Text(""), finding_changes_table(findings)]
    parts += [
        Text(""),
        Text(
            f"{len(diff.unchanged_tensors)} tensors and {len(diff.unchanged_collectives)} collective rows unchanged",
            "dim",
        ),
    ]
    parts += [Text(f"note: {note}", "yellow") for note in diff.notes]
    return Group(*parts)
