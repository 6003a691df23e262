"""A diff as plain JSON data and back (`diff --json`, check reports): the verdict, the notes, every change with
its per-dimension and per-field details, and the traffic totals before and after.

A change's sides are written as the plan JSON writes their records (a tensor, a finding) and read back into
them through the diff's types (`shardscope.diff.schema`), which also give the diff JSON's published schema.
"""

from __future__ import annotations

from typing import Any

from shardscope.case.topology import format_mesh
from shardscope.diff.changes import Change, CollectiveSide, Detail, DimChange, PlanDiff, Side
from shardscope.diff.kinds import ChangeKind
from shardscope.errors import PlanError
from shardscope.plan.estimate import Estimate
from shardscope.plan.estimate_json import estimate_to_json
from shardscope.plan.findings import Finding
from shardscope.plan.json import cause_to_json, finding_to_json, tensor_to_json
from shardscope.plan.records import CaseRecord, TensorRecord
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


def collective_side_to_json(side: CollectiveSide) -> dict[str, Any]:
    """The rows of one collective key as the diff JSON spells them (a plan row's names; `axes_label` and
    `traffic` besides)."""
    return {
        "op": side.op,
        "axes": jsonable(side.axes),
        "axes_label": side.axes_label,
        "groups": side.groups,
        "dtype": side.dtype,
        "shape": list(side.shape),
        "pass": side.pass_,
        "source": side.source,
        "shift": side.shift,
        "count": side.count,
        "bytes": jsonable(side.bytes),
        "loop_trips": jsonable(side.loop_trips),
        "traffic": side.traffic,
        "cause": None if side.cause is None else cause_to_json(side.cause),
    }


def side_to_json(side: Side) -> Any:
    """One side of a change as JSON: a record as the plan JSON spells it, a value as it is."""
    if isinstance(side, TensorRecord):
        return tensor_to_json(side)
    if isinstance(side, CollectiveSide):
        return collective_side_to_json(side)
    if isinstance(side, Finding):
        return finding_to_json(side)
    return jsonable(side)


def change_to_json(change: Change) -> dict[str, Any]:
    """One change: kind, subject, both sides (None where absent) and its details."""
    return {
        "kind": str(change.kind),
        "subject": change.subject,
        "before": side_to_json(change.before),
        "after": side_to_json(change.after),
        "details": [detail_to_json(d) for d in change.details],
    }


def changes_from_json(data: Any, source: str = "diff") -> tuple[Change, ...]:
    """The changes of a `diff_to_json` document, their sides the plan's records again (a diff's totals and
    notes are read from it as they are).

    Raises:
      PlanError: not a diff document, or a change with a missing or mistyped field (named in the message).
    """
    from shardscope.diff.schema import ChangeDocument  # lazy: pydantic loads on first use
    from shardscope.plan.schema import validate_document

    if not isinstance(data, dict) or not isinstance(data.get("changes"), list):
        raise PlanError(f"{source}: not a shardscope diff (expected a JSON object with a list of changes)")
    changes = validate_document(list[ChangeDocument], data["changes"], f"{source}: corrupt diff changes")
    return tuple(
        Change(ChangeKind(c["kind"]), c["subject"], c["before"], c["after"], tuple(c["details"])) for c in changes
    )


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
