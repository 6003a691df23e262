"""The collective changes of the HTML diff report: rows, the largest by traffic for the first screen, and the
groups under the rule changes that caused them (each row's cause as its tooltip)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardscope.diff.causes import traffic_delta
from shardscope.diff.changes import Change, PlanDiff
from shardscope.plan.records import Cause
from shardscope.report.diff_terminal import (
    COLLECTIVE_MARKS,
    collective_axes,
    collective_shape,
    signed_bytes,
    stat_text,
)
from shardscope.report.rule_changes import explained_groups

__all__ = ["collective_groups", "collective_rows", "top_collectives"]

ROW_CLASS = {"collective_removed": "del", "collective_added": "add", "collective_changed": "chg"}


def collective_rows(changes: Sequence[Change]) -> list[dict[str, Any]]:
    rows = []
    for change in changes:
        row = change.collective
        moved = {f.field for f in change.fields}
        rows.append(
            {
                "mark": COLLECTIVE_MARKS[change.kind],
                "cls": ROW_CLASS[change.kind],
                "op": row.op,
                "axes": collective_axes(row),
                "pass": row.pass_,
                "source": row.source or "(top level)",
                "shape": collective_shape(row),
                "why": _why_text(row.cause),
                "stats": [
                    {"text": stat_text(change, name), "moved": name in moved}
                    for name in ("count", "bytes", "loop_trips", "traffic")
                ],
            }
        )
    return rows


def _why_text(cause: Cause | None) -> str:
    """A collective's cause in one line, for the row's tooltip ("" without one)."""
    if cause is None:
        return ""
    where = f" at {cause.line}" if cause.line else ""
    return f"moves {', '.join(cause.tensors) or '?'}; needed by {cause.consumer}{where}; rule: {cause.rules_text}"


TOP_CHANGES = 5  # collective changes on the report's first screen


def top_collectives(diff: PlanDiff, changes: Sequence[Change]) -> list[dict[str, Any]]:
    """The largest collective changes by traffic, each with the rule change that caused it (first screen)."""
    why = {
        subject: f"{rule.logical}: {rule.move}" if rule.move else rule.title
        for rule in diff.rule_changes
        for subject in rule.collectives
    }
    why |= {subject: "compiler's choice" for subject in diff.compilers_choices}
    ranked = sorted(changes, key=lambda c: -abs(traffic_delta(c)))[:TOP_CHANGES]
    rows = []
    for change, row in zip(ranked, collective_rows(ranked), strict=True):
        delta = traffic_delta(change)
        rows.append(
            row
            | {"delta": signed_bytes(delta), "trend": "up" if delta > 0 else "down", "why": why.get(change.subject, "")}
        )
    return rows


def collective_groups(diff: PlanDiff, changes: Sequence[Change]) -> list[dict[str, Any]]:
    """The collective changes grouped under the rule changes that caused them, then the compiler's choices
    (one group of every change when the plans record no causes)."""
    groups = explained_groups(diff)
    if not groups:
        return [
            {"title": "", "logical": "", "move": "", "traffic": "", "placed": "", "is_rule": False}
            | {"rows": collective_rows(changes)}
        ]
    by_subject = {c.subject: c for c in changes}

    def ranked(subjects: list[str]) -> list[Change]:
        # Largest traffic move first within a group (the groups come ordered the same way).
        found = [by_subject[s] for s in subjects if s in by_subject]
        return sorted(found, key=lambda c: -abs(traffic_delta(c)))

    return [
        {
            "title": group.title,
            "logical": group.logical,
            "move": group.move,
            "traffic": group.traffic,
            "placed": group.placed,
            "is_rule": group.is_rule,
            "rows": collective_rows(ranked([subject for _, subject, _ in group.rows])),
        }
        for group in groups
    ]
