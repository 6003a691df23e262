"""A diff as plain JSON data and back (`diff --json`, check reports): the verdict, the notes, every change with
its per-dimension and per-field details, and the traffic totals before and after."""

from __future__ import annotations

from typing import Any

from shardscope.case.topology import format_mesh
from shardscope.diff.changes import Change, Detail, DimChange, FieldChange, PlanDiff
from shardscope.diff.kinds import ChangeKind
from shardscope.plan.estimate import Estimate
from shardscope.plan.estimate_json import estimate_to_json
from shardscope.plan.records import CaseRecord
from shardscope.plan.totals import TrafficTotals


def jsonable(value: Any) -> Any:
    """Tuples (specs, shapes) as JSON lists, recursively; anything else as it is."""
    if isinstance(value, tuple):
        return [jsonable(v) for v in value]
    return value


def case_dict(case: CaseRecord) -> dict[str, Any]:
    """The case header as plain data; the mesh as its ordered CLI spelling."""
    return {
        "model": case.model,
        "preset": case.preset,
        **({"preset_source": case.preset_source} if case.preset_source else {}),
        "topology": case.topology,
        "mesh": format_mesh(case.mesh),
        "axis_types": case.axis_types,
        "overrides": dict(case.overrides),
    }


def detail_to_json(d: Detail) -> dict[str, Any]:
    """One detail of a change: a dimension whose spec entry moved, or a field that moved."""
    if isinstance(d, DimChange):
        return {
            "dim": d.dim,
            "logical": d.logical,
            "before": jsonable(d.before),
            "after": jsonable(d.after),
            "axes_added": list(d.axes_added),
            "axes_dropped": list(d.axes_dropped),
        }
    return {"field": d.field, "before": jsonable(d.before), "after": jsonable(d.after)}


def change_to_json(change: Change) -> dict[str, Any]:
    """One change: kind, subject, both sides (None where absent) and its details."""
    return {
        "kind": str(change.kind),
        "subject": change.subject,
        "before": jsonable(change.before),
        "after": jsonable(change.after),
        "details": [detail_to_json(d) for d in change.details],
    }


def _entry(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def detail_from_json(data: dict[str, Any]) -> Detail:
    """Reads `detail_to_json` data back (KeyError/TypeError when it is not a detail)."""
    if "dim" in data:
        return DimChange(
            dim=int(data["dim"]),
            logical=data["logical"],
            before=_entry(data["before"]),
            after=_entry(data["after"]),
            axes_added=tuple(data["axes_added"]),
            axes_dropped=tuple(data["axes_dropped"]),
        )
    return FieldChange(str(data["field"]), data["before"], data["after"])


def change_from_json(data: dict[str, Any]) -> Change:
    """Reads `change_to_json` data back into the same Change."""
    return Change(
        kind=ChangeKind(data["kind"]),
        subject=str(data["subject"]),
        before=data["before"],
        after=data["after"],
        details=tuple(detail_from_json(d) for d in data["details"]),
    )


def changes_from_json(data: dict[str, Any]) -> tuple[Change, ...]:
    """The changes of a `diff_to_json` document (a diff's totals and notes are read from it as they are)."""
    return tuple(change_from_json(entry) for entry in data["changes"])


def diff_to_json(diff: PlanDiff) -> dict[str, Any]:
    """A diff as plain JSON data: the verdict, the notes, every change (with its per-dimension and per-field
    details) and the traffic totals before and after."""

    def totals(t: TrafficTotals) -> dict[str, Any]:
        return {"total": t.total, "by_axes": dict(t.by_axes), "by_op": dict(t.by_op), "by_pass": dict(t.by_pass)}

    def cost(estimate: Estimate | None) -> dict[str, Any] | None:
        if estimate is None:
            return None
        # The per-row times stay in the plans' own estimates; a diff carries the totals.
        return {k: v for k, v in estimate_to_json(estimate).items() if k not in ("rows", "cross_slice")}

    return {
        "same": diff.same,
        "cost_before": cost(diff.cost_before),
        "cost_after": cost(diff.cost_after),
        "old": case_dict(diff.old_case),
        "new": case_dict(diff.new_case),
        "notes": list(diff.notes),
        "changes": [change_to_json(c) for c in diff.changes],
        "traffic_before": totals(diff.totals_before),
        "traffic_after": totals(diff.totals_after),
        "unchanged_tensors": len(diff.unchanged_tensors),
        "unchanged_collectives": len(diff.unchanged_collectives),
        "unchanged_findings": len(diff.unchanged_findings),
        "rule_changes": [
            {
                "logical": r.logical,
                "before": list(r.before),
                "after": list(r.after),
                "tensors": list(r.tensors),
                "collectives": list(r.collectives),
                "traffic_delta": r.traffic_delta,
            }
            for r in diff.rule_changes
        ],
        "compilers_choices": list(diff.compilers_choices),
    }
