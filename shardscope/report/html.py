"""A plan diff as one self-contained HTML page for code review: inline CSS, no script, no network fetch.

The page is built from a plain view model (dicts of strings) so the template stays declarative; jinja2
autoescapes every value, because tensor paths, preset names and sources come from user code.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from shardscope.atomic import write_atomic
from shardscope.case.rules import SpecEntry
from shardscope.case.topology import mesh_label
from shardscope.diff.changes import Change, DimChange, PlanDiff
from shardscope.diff.grouping import group_tensor_changes, unit_axes
from shardscope.diff.json import case_dict
from shardscope.diff.kinds import COLLECTIVE_CHANGE_KINDS, FINDING_CHANGE_KINDS, TENSOR_CHANGE_KINDS
from shardscope.plan.records import TENSOR_KINDS as RECORD_KINDS
from shardscope.plan.records import CaseRecord, CollectiveRow, TensorRecord, axes_with_marks
from shardscope.plan.units import human_bytes, human_seconds
from shardscope.report.diff_terminal import (
    COLLECTIVE_MARKS,
    TENSOR_MARKS,
    case_title,
    cost_lines,
    delta_text,
    dim_phrases,
    headline_sections,
    preset_origin,
    seconds_delta,
    summary_counts,
    tensor_bytes,
    trend,
    trend_seconds,
    value_text,
    verdict_text,
)
from shardscope.report.estimate_text import cost_rows, memory_source_label, route_label, target_label
from shardscope.report.findings import FINDING_MARKS, FINDING_VERBS, finding_change_text
from shardscope.report.html_collectives import collective_groups, collective_rows, top_collectives
from shardscope.report.layout import spec_text
from shardscope.report.svg import paired_bars, stacked_against_capacity

TEMPLATES = Path(__file__).parent / "templates"
# Collective row classes, so that added/removed/changed rows read like a code diff.


@cache
def environment() -> jinja2.Environment:
    # autoescape=True for every template (not only *.html): the CSS partial holds no values, and a name
    # rendered anywhere else must never become markup.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _case(case: CaseRecord, holds: str) -> dict[str, Any]:
    overrides = " ".join(f"{k}={v}" for k, v in case.overrides) or "none"
    extra = {"origin": preset_origin(case, holds), "holds": holds}
    return case_dict(case) | {"mesh": mesh_label(case.mesh), "overrides": overrides} | extra


def _sizes(before: int | None, after: int | None) -> dict[str, str]:
    # One before/after/delta cell set, with the trend as a CSS class.
    return {
        "before": human_bytes(before) if before is not None else "—",
        "after": human_bytes(after) if after is not None else "—",
        "delta": delta_text(before, after),
        "trend": trend(before, after),
    }


def _stat_cards(diff: PlanDiff) -> list[dict[str, str]]:
    memory_before, memory_after = dict(diff.memory_before), dict(diff.memory_after)
    cards = [("Traffic / device / step", diff.totals_before.total, diff.totals_after.total)]
    for name, label in (("temp_bytes", "Temp memory / device"), ("argument_bytes", "Arguments / device")):
        if name in memory_before or name in memory_after:
            cards.append((label, memory_before.get(name), memory_after.get(name)))  # type: ignore[arg-type]
    views = [{"label": label, **_sizes(before, after)} for label, before, after in cards]
    if not diff.traffic_compared:  # a tensors-only side: its traffic is unknown, not 0 B
        views[0] = {"label": views[0]["label"], "before": "—", "after": "unknown", "delta": "nothing compiled"}
        views[0]["trend"] = "same"
    return _time_cards(diff) + _hbm_cards(diff) + views


def _hbm_cards(diff: PlanDiff) -> list[dict[str, str]]:
    """The HBM a device needs against its capacity, when both plans are priced."""
    before, after = diff.cost_before, diff.cost_after
    if before is None or after is None:
        return []
    fits = "fits" if after.memory.fits else "does not fit"
    label = f"HBM need / device ({fits} in {human_bytes(after.memory.capacity)})"
    return [{"label": label, **_sizes(before.memory.total, after.memory.total)}]


def _time_cards(diff: PlanDiff) -> list[dict[str, str]]:
    """A first card with the estimated step (or communication) time, when both plans are priced."""

    before, after = diff.cost_before, diff.cost_after
    if before is None or after is None:
        return []
    if any(not e.rows and e.compute.flops is None for e in (before, after)):
        return []  # a tensors-only plan has no time to compare (the cost section says so)
    where = target_label(after)
    if before.expected is not None and after.expected is not None:
        label = f"Expected step on {where} ({route_label(after)})"
        old, new = before.expected, after.expected
    elif before.compute.flops is not None and after.compute.flops is not None:
        label, old, new = f"Step time, not overlapped ({where})", before.step_no_overlap, after.step_no_overlap
    else:
        label, old, new = f"Communication time / step ({where})", before.communication, after.communication
    return [
        {
            "label": label,
            "before": human_seconds(old),
            "after": human_seconds(new),
            "delta": seconds_delta(old, new),
            "trend": trend_seconds(old, new),
        }
    ]


def _entry_parts(entry: SpecEntry, dim: DimChange | None, side: str, unit: frozenset[str]) -> list[dict[str, str]]:
    # Axes this side gained (after) or lost (before) are marked, size-1 axes more quietly (they move
    # nothing); the rest of the entry reads plainly.
    marked: tuple[str, ...] = ()
    if dim is not None:
        marked = dim.axes_added if side == "after" else dim.axes_dropped

    def cls(axis: str) -> str:
        if axis not in marked:
            return ""
        return ("ax-add" if side == "after" else "ax-drop") + (" unit" if axis in unit else "")

    if entry is None:
        return [{"text": "None", "cls": "none"}]
    if isinstance(entry, str):
        return [{"text": repr(entry), "cls": cls(entry)}]
    parts = [{"text": "(", "cls": ""}]
    for index, axis in enumerate(entry):
        if index:
            parts.append({"text": ", ", "cls": ""})
        parts.append({"text": repr(axis), "cls": cls(axis)})
    return [*parts, {"text": ")", "cls": ""}]


def spec_cells(
    spec: Sequence[SpecEntry], dims: Iterable[DimChange], side: str, unit: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """A spec split per dimension for the template; changed dimensions carry their side's class."""
    changed = {d.dim: d for d in dims}
    return [
        {"changed": i in changed, "parts": _entry_parts(entry, changed.get(i), side, unit)}
        for i, entry in enumerate(spec)
    ]


def _tensor_row(change: Change, mirrors: Sequence[str], unit: frozenset[str]) -> dict[str, Any]:
    specs = []
    for name, record in zip(("before", "after"), change.tensor_sides, strict=True):
        if record is not None:
            specs.append({"side": name, "cells": spec_cells(record.spec, change.dims, name, unit)})
    before, after = tensor_bytes(change)
    # The template shows the shape as a list (its JSON spelling, as before the sides were records).
    shapes = [{"dtype": r.dtype, "dims": list(r.shape)} for r in change.tensor_sides if r is not None]
    return {
        "mark": TENSOR_MARKS[change.kind],
        "cls": {"tensor_added": "add", "tensor_removed": "del"}.get(change.kind, ""),
        "path": change.subject,
        "mirrors": list(mirrors),
        "alike": [],  # other tensors with this very change (see `_tensor_sections`)
        "shapes": shapes if len(shapes) == 1 or shapes[0] != shapes[1] else shapes[:1],
        "specs": specs,
        "phrases": dim_phrases(change, unit) or ["added" if change.before is None else "removed"],
        "dims": [_dim_view(d, unit) for d in change.dims],
        "bytes": _sizes(before, after),
        "kind": change.tensor.kind,
    }


def _dim_view(dim: DimChange, unit: frozenset[str]) -> dict[str, Any]:
    def pills(sign: str, axes: Sequence[str]) -> list[dict[str, Any]]:
        return [{"text": f"{sign}{a}", "unit": a in unit} for a in axes]

    return {
        "dim": dim.dim,
        "logical": dim.logical or "(unnamed)",
        "added": pills("+", dim.axes_added),
        "dropped": pills("−", dim.axes_dropped),
    }


def _tensor_sections(diff: PlanDiff) -> list[dict[str, Any]]:
    # One table body per tensor kind (param, opt_state, …), in the plan's kind order.
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    unit = unit_axes(diff.old_case, diff.new_case)
    # Tensors of one kind whose every dimension changed identically (same logical names, same axes before and
    # after) fold into the first of them, the others listed under it.
    first: dict[tuple[Any, ...], dict[str, Any]] = {}
    for group in group_tensor_changes(diff.of_kind(*TENSOR_CHANGE_KINDS)):
        row = _tensor_row(group.change, group.mirrors, unit)
        signature = (
            row["kind"],
            group.change.kind,
            tuple((d.dim, d.logical, d.before, d.after) for d in group.change.dims),
        )
        if group.change.dims and signature in first:
            first[signature]["alike"].append(group.change.subject)
            continue
        first[signature] = row
        rows[row["kind"]].append(row)
    order = list(RECORD_KINDS) + sorted(k for k in rows if k not in RECORD_KINDS)
    return [
        {"kind": kind, "rows": rows[kind], "count": len(rows[kind]) + sum(len(r["alike"]) for r in rows[kind])}
        | {"shown": len(rows[kind])}
        for kind in order
        if rows.get(kind)
    ]


def _unchanged_tensor(path: str, tensor: TensorRecord) -> dict[str, str]:
    return {
        "path": path,
        "kind": tensor.kind,
        "shape": f"{tensor.dtype}[{','.join(map(str, tensor.shape))}]",
        "spec": spec_text(tensor.spec),
        "bytes": human_bytes(tensor.bytes_per_device),
    }


def _unchanged_collective(row: CollectiveRow) -> dict[str, Any]:
    return {
        "op": row.op,
        "axes": axes_with_marks(row),
        "pass": row.pass_,
        "source": row.source or "(top level)",
        "shape": f"{row.dtype}[{','.join(map(str, row.shape))}]",
        "stats": [str(row.count), human_bytes(row.bytes), str(row.loop_trips or "?"), human_bytes(row.traffic)],
    }


def _finding_rows(changes: Sequence[Change]) -> list[dict[str, str]]:
    # An added finding is bad news and a resolved one good: their rows read like a verdict, not a code diff.
    classes = {"finding_added": "f-new", "finding_resolved": "f-gone", "finding_changed": "chg"}
    rows = []
    for change in changes:
        side = change.finding
        rows.append(
            {
                "mark": FINDING_MARKS[change.kind],
                "cls": classes[change.kind],
                "verb": FINDING_VERBS[change.kind],
                "severity": side.severity,
                "id": side.lint,
                "subject": side.subject,
                "message": finding_change_text(change),
                "fix": side.fix,
            }
        )
    return rows


def _provenance(diff: PlanDiff) -> list[dict[str, Any]]:
    old, new = dict(diff.provenance_before), dict(diff.provenance_after)
    keys = list(old) + [k for k in new if k not in old]
    return [
        {
            "key": k,
            "before": value_text(old.get(k)),
            "after": value_text(new.get(k)),
            "differs": old.get(k) != new.get(k),
        }
        for k in keys
    ]


def _cost(diff: PlanDiff) -> dict[str, Any] | None:
    """The estimate section: headline, a time table, time per mesh axis and HBM against capacity as SVG."""

    before, after = diff.cost_before, diff.cost_after
    target = after or before
    if target is None:
        return None
    rows = cost_rows(before, after)
    sides = [(name, e) for name, e in (("before", before), ("after", after)) if e is not None]
    return {
        "target": target_label(target),
        "efficiency": f"{target.efficiency:g} ({target.efficiency_source})",
        "headlines": cost_lines(diff),
        "rows": [
            {
                "section": section,
                "name": name,
                "before": human_seconds(b),
                "after": human_seconds(a),
                "delta": "" if b is None or a is None else seconds_delta(b, a),
                "trend": trend_seconds(b, a),
            }
            for section, name, b, a in rows
        ],
        "axes_svg": paired_bars([(n, b, a) for s, n, b, a in rows if s == "mesh axis"], human_seconds),
        "memory_svg": stacked_against_capacity(
            [(name, e.memory.categories) for name, e in sides], target.memory.capacity, human_bytes_float
        ),
        "memory_source": _memory_sources(sides),
    }


def _memory_sources(sides: Sequence[tuple[str, Any]]) -> str:

    labels = {name: memory_source_label(estimate) for name, estimate in sides}
    if len(set(labels.values())) == 1:
        return next(iter(labels.values()))
    return "; ".join(f"{name}: {label}" for name, label in labels.items())


def human_bytes_float(value: float) -> str:
    """human_bytes for chart labels, which may carry fractions."""
    return human_bytes(int(value))


def view_model(diff: PlanDiff) -> dict[str, Any]:
    """Everything the template shows, as plain strings, lists and dicts."""
    collectives = diff.of_kind(*COLLECTIVE_CHANGE_KINDS)
    tensor_sections = _tensor_sections(diff)
    return {
        "old": _case(diff.old_case, diff.old_holds),
        "new": _case(diff.new_case, diff.new_holds),
        "title": f"{case_title(diff.old_case)} → {case_title(diff.new_case)}",
        "same": diff.same,
        "change_count": len(diff.changes),
        "verdict": verdict_text(diff)[0],
        "differs": verdict_text(diff)[1],
        "counts": summary_counts(diff),
        "stats": _stat_cards(diff),
        "case_changes": [
            {"field": c.subject, "before": value_text(c.before), "after": value_text(c.after)}
            for c in diff.of_kind("case", "extra_changed")
        ],
        "sections": [
            {"title": s.title, "rows": [{"name": n, **_sizes(b, a)} for n, b, a in s.rows]}
            for s in headline_sections(diff)
        ],
        "tensor_sections": tensor_sections,
        "tensor_rows": sum(s["shown"] for s in tensor_sections),
        "tensor_changes": len(diff.of_kind(*TENSOR_CHANGE_KINDS)),
        "collectives": collective_rows(collectives),
        "collective_groups": collective_groups(diff, collectives),
        "top_collectives": top_collectives(diff, collectives),
        "collective_marks": {m: sum(1 for c in collectives if COLLECTIVE_MARKS[c.kind] == m) for m in "+−~"},
        "unchanged_tensors": [_unchanged_tensor(p, t) for p, t in diff.unchanged_tensors],
        "unchanged_collectives": [_unchanged_collective(r) for r in diff.unchanged_collectives],
        "findings": _finding_rows(diff.of_kind(*FINDING_CHANGE_KINDS)),
        "unchanged_findings": [
            {"severity": f.severity, "id": f.lint, "subject": f.subject, "message": f.message}
            for f in diff.unchanged_findings
        ],
        "notes": list(diff.notes),
        "tolerance": f"{diff.temp_tolerance:.0%}",
        "provenance": _provenance(diff),
        "cost": _cost(diff),
    }


def render_html(diff: PlanDiff) -> str:
    """The diff as one self-contained HTML document (inline CSS, no scripts, no external resources)."""
    return environment().get_template("diff.html.j2").render(view_model(diff))


def write_html(diff: PlanDiff, path: str | Path) -> None:
    """Renders the diff and writes it atomically to `path`."""
    path = Path(path)
    write_atomic(path, render_html(diff))


def render_html_many(diffs: Sequence[PlanDiff]) -> str:
    """Several diffs (a `check` with more than one changed case) as one document, one section each.

    Each report is rendered on its own and its <main> section kept, so every case reads exactly as its
    single report would.
    """
    if len(diffs) == 1:
        return render_html(diffs[0])
    if not diffs:
        raise ValueError("render_html_many needs at least one diff")
    pages = [render_html(diff) for diff in diffs]
    sections = [page[page.index("<main>") : page.index("</main>") + len("</main>")] for page in pages]
    first = pages[0]
    return first[: first.index("<main>")] + "\n<hr>\n".join(sections) + first[first.index("</main>") + len("</main>") :]
