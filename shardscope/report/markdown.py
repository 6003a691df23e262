"""A plan diff as a Markdown summary short enough for a pull-request comment.

Headline totals that moved, the largest tensor changes (mirrors folded, the rest summarised by pattern)
and the collective changes grouped by op, axes and pass. Every name is escaped: a tensor path is user
data, and in a PR comment `<script>` must stay text and `|` must not split a table cell.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from pathlib import Path

from shardscope.atomic import write_atomic
from shardscope.case.topology import mesh_label
from shardscope.diff.causes import traffic_delta
from shardscope.diff.changes import Change, PlanDiff
from shardscope.diff.grouping import TensorGroup, group_tensor_changes, unit_axes
from shardscope.diff.kinds import COLLECTIVE_CHANGE_KINDS, FINDING_CHANGE_KINDS, TENSOR_CHANGE_KINDS
from shardscope.golden.check import CaseOutcome, CheckSummary
from shardscope.plan.records import CaseRecord
from shardscope.plan.units import human_bytes, human_seconds
from shardscope.report.diff_terminal import (
    COLLECTIVE_MARKS,
    NOT_COMPILED,
    cost_lines,
    delta_text,
    dim_phrases,
    headline_sections,
    preset_origin,
    seconds_delta,
    signed_bytes,
    summary_counts,
    tensor_bytes,
    value_text,
    verdict_text,
)
from shardscope.report.estimate_text import cost_headline, cost_rows
from shardscope.report.findings import FINDING_MARKS, finding_change_text
from shardscope.report.rule_changes import explained_groups

TOP_TENSORS = 6
TOP_COLLECTIVES = 6
TOP_FINDINGS = 10
TOP_RULE_CHANGES = 4  # rule-change lines in the PR comment
# Inline Markdown that could turn a name into formatting, a link, math or a broken table cell.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~$])")


def md_escape(text: str) -> str:
    """Makes any text literal inside a Markdown line or table cell.

    HTML-special characters become entities (so `<script>` renders as text on every renderer), inline
    Markdown characters get a backslash, and a line break becomes a space (it would end a table row).
    """
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(text.splitlines()))


def _case(label: str, case: CaseRecord, holds: str) -> str:
    overrides = ", ".join(f"{k}={v}" for k, v in case.overrides)
    return (
        f"**{label}** {md_escape(case.model)} under **{md_escape(case.preset)}**"
        f" ({md_escape(preset_origin(case, holds))}) on {md_escape(case.topology)}"
        f" · mesh {md_escape(mesh_label(case.mesh))} · axes {md_escape(case.axis_types)}"
        + (f" · set {md_escape(overrides)}" if overrides else "")
        + (f" · {md_escape(holds)}" if holds else "")
    )


def _headline(diff: PlanDiff) -> list[str]:
    # Rows that did not move are left out to keep the comment short; the HTML report has them all.
    total_before, total_after = diff.totals_before.total, diff.totals_after.total
    lines = ["| per device | before | after | Δ |", "|:--|--:|--:|--:|"]
    if diff.traffic_compared:
        lines.append(
            f"| **traffic / step** | {human_bytes(total_before)} | {human_bytes(total_after)} "
            f"| {delta_text(total_before, total_after) or '·'} |"
        )
    else:
        lines.append(f"| **traffic / step** | {md_escape(NOT_COMPILED)} | | |")
    labels = {
        "Traffic per mesh axis": "over {}",
        "Traffic per op": "{}",
        "Traffic per pass": "{} pass",
        "Memory per device": "{} memory",
    }
    for section in headline_sections(diff):
        if section.title not in labels:
            continue
        for name, before, after in section.rows:
            if before != after:
                label = md_escape(labels[section.title].format(name))
                lines.append(
                    f"| {label} | {human_bytes(before)} | {human_bytes(after)} | {delta_text(before, after)} |"
                )
    return lines


def _cost(diff: PlanDiff) -> list[str]:
    """The cost headline and the time per mesh axis that moved, when both plans are priced."""

    if diff.cost_before is None or diff.cost_after is None:
        return []
    lines = [f"**{md_escape(line)}**  " for line in cost_lines(diff)]
    moved = [
        row
        for row in cost_rows(diff.cost_before, diff.cost_after)
        if row[0] in ("mesh axis", "total") and row[2] != row[3]
    ]
    if moved:
        lines += ["", "| estimated time / step | before | after | Δ |", "|:--|--:|--:|--:|"]
        for section, name, before, after in moved:
            label = f"over {name}" if section == "mesh axis" else f"**{name}**"
            delta = "" if before is None or after is None else seconds_delta(before, after)
            lines.append(
                f"| {md_escape(label) if section == 'mesh axis' else label} | {human_seconds(before)} "
                f"| {human_seconds(after)} | {delta} |"
            )
    return [*lines, ""]


def _weight(group: TensorGroup, unit: Collection[str]) -> tuple[int, int, int, str]:
    # Largest moves of bytes per device first (mirrors count: they are real memory), then the changes
    # that move real mesh axes (size-1 axes place nothing), then the most mirrored, then by path.
    before, after = tensor_bytes(group.change)
    moved = sum(a not in unit for d in group.change.dims for a in d.axes_added + d.axes_dropped)
    copies = 1 + len(group.mirrors)
    return (-abs((after or 0) - (before or 0)) * copies, -moved, -copies, group.change.subject)


def _pattern(change: Change) -> str:
    # The change without logical names, so that one resharding rule shows as one pattern.
    if change.kind in ("tensor_added", "tensor_removed"):
        return change.kind.removeprefix("tensor_")
    moves = [
        f"dim {d.dim} " + " ".join([f"+{a}" for a in d.axes_added] + [f"−{a}" for a in d.axes_dropped])
        for d in change.dims
    ]
    return ", ".join(moves) or "shape/dtype/axes"


def _tensors(groups: Sequence[TensorGroup], unit: Collection[str]) -> list[str]:
    ranked = sorted(groups, key=lambda group: _weight(group, unit))
    lines = ["| tensor | change | bytes / device |", "|:--|:--|--:|"]
    for group in ranked[:TOP_TENSORS]:
        change = group.change
        before, after = tensor_bytes(change)
        sizes = " → ".join(human_bytes(b) for b in (before, after) if b is not None)
        if before is not None and after is not None and before != after:
            sizes += f" ({signed_bytes(after - before)})"
        mirrors = f" (+{len(group.mirrors)} mirrors)" if group.mirrors else ""
        what = "; ".join(dim_phrases(change, unit)) or change.kind.removeprefix("tensor_")
        lines.append(f"| {md_escape(change.subject)}{mirrors} | {md_escape(what)} | {sizes} |")
    rest = ranked[TOP_TENSORS:]
    if rest:
        patterns = Counter(_pattern(g.change) for g in rest).most_common(3)
        summary = "; ".join(f"{n} × ({md_escape(p)})" for p, n in patterns)
        lines += ["", f"… and {len(rest)} more: {summary}."]
    return lines


def _collectives(changes: Sequence[Change]) -> list[str]:
    # One line per (mark, op, axes, pass): how many rows and how much traffic moved with them. Rows over
    # single-device groups move nothing, as in the headline totals.
    groups: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for change in changes:
        row = change.collective
        key = (COLLECTIVE_MARKS[change.kind], row.op, row.axes_label, row.pass_)
        groups[key][0] += 1
        if row.axes != ():
            groups[key][1] += traffic_delta(change)
    ranked = sorted(groups.items(), key=lambda item: (-abs(item[1][1]), item[0]))
    lines = ["| | op | axes | pass | rows | traffic / step |", "|:-:|:--|:--|:--|--:|--:|"]
    for (mark, op, axes, pass_), (rows, traffic) in ranked[:TOP_COLLECTIVES]:
        cells = " | ".join(md_escape(v) for v in (mark, op, axes, pass_))
        lines.append(f"| {cells} | {rows} | {signed_bytes(traffic)} |")
    if len(ranked) > TOP_COLLECTIVES:
        rest = ranked[TOP_COLLECTIVES:]
        lines += ["", f"… and {len(rest)} more groups ({sum(r for _, (r, _) in rest)} rows)."]
    return lines


def _findings(changes: Sequence[Change]) -> list[str]:
    # Added findings first (what a reviewer must answer), then changed, then resolved; the most severe first.
    order = {"finding_added": 0, "finding_changed": 1, "finding_resolved": 2}
    rank = {"error": 0, "warning": 1, "info": 2}
    ranked = sorted(changes, key=lambda c: (order[c.kind], rank.get(c.finding.severity, 3)))
    lines = ["| | severity | lint | subject | finding |", "|:-:|:--|:--|:--|:--|"]
    for change in ranked[:TOP_FINDINGS]:
        side = change.finding
        cells = [FINDING_MARKS[change.kind], side.severity, side.lint, side.subject, finding_change_text(change)]
        lines.append("| " + " | ".join(md_escape(str(cell)) for cell in cells) + " |")
    if len(ranked) > TOP_FINDINGS:
        lines += ["", f"… and {len(ranked) - TOP_FINDINGS} more (the HTML report has them all)."]
    return lines


def render_markdown(diff: PlanDiff) -> str:
    """The diff as a PR-comment summary (about 50 lines however large the plans are)."""
    verdict = verdict_text(diff)[0]
    lines = [
        f"### shardscope plan diff: {verdict}",
        "",
        _case("old", diff.old_case, diff.old_holds) + "  ",
        _case("new", diff.new_case, diff.new_holds),
        "",
    ]
    case_changes = diff.of_kind("case", "extra_changed")
    if case_changes:
        moved = ", ".join(
            f"{md_escape(c.subject)} {md_escape(value_text(c.before))} → {md_escape(value_text(c.after))}"
            for c in case_changes
        )
        lines += [f"Case: {moved}", ""]
    if diff.same:
        lines.append("Tensors, collectives and memory are identical (provenance is not compared).")
        return "\n".join(lines) + "\n"
    lines += [md_escape(", ".join(summary_counts(diff))) + ".", ""]
    lines += _cost(diff)
    lines += _headline(diff)
    groups = group_tensor_changes(diff.of_kind(*TENSOR_CHANGE_KINDS))
    if groups:
        lines += ["", f"**Changed tensors** ({len(diff.of_kind(*TENSOR_CHANGE_KINDS))}, mirrors folded)", ""]
        lines += _tensors(groups, unit_axes(diff.old_case, diff.new_case))
    collectives = diff.of_kind(*COLLECTIVE_CHANGE_KINDS)
    if collectives:
        lines += ["", "**Collective changes** (+ added, − removed, ~ changed)", ""]
        lines += _collectives(collectives)
    explained = explained_groups(diff)
    if explained:
        lines += ["", "**Why the collectives changed**", ""]
        for group in explained[:TOP_RULE_CHANGES]:
            changes = f"{len(group.rows)} collective change{'s' if len(group.rows) != 1 else ''}"
            title = f"`{group.logical}`: {md_escape(group.move)}" if group.logical else f"_{md_escape(group.title)}_"
            placed = f" ({md_escape(group.placed)})" if group.placed else ""
            lines.append(f"- {title}: {changes}, {md_escape(group.traffic)}{placed}")
        if len(explained) > TOP_RULE_CHANGES:
            lines.append(f"- … and {len(explained) - TOP_RULE_CHANGES} more (the HTML report has them all)")
    findings = diff.of_kind(*FINDING_CHANGE_KINDS)
    if findings:
        lines += ["", "**Lint findings** (+ added, − resolved, ~ changed)", ""]
        lines += _findings(findings)
    lines += ["", *(f"_{md_escape(note)}_" for note in diff.notes)]
    unchanged = f"{len(diff.unchanged_tensors)} tensors and {len(diff.unchanged_collectives)} collective rows unchanged"
    lines.append(f"{unchanged}; the HTML report has every row.")
    return "\n".join(lines) + "\n"


def write_markdown(diff: PlanDiff, path: str | Path) -> None:
    """Renders the summary and writes it atomically to `path`."""
    path = Path(path)
    write_atomic(path, render_markdown(diff))


def render_check_markdown(outcomes: Sequence[CaseOutcome], summary: CheckSummary) -> str:
    """A whole check for a PR comment: one summary table (a line per case), then each changed case's diff."""
    lines = [f"## shardscope check: {md_escape(summary.line)}", ""]
    lines += ["| case | status | what changed |", "|:--|:--|:--|"]
    for outcome in outcomes:
        detail = outcome.message
        if outcome.diff is not None and not outcome.diff.same:
            detail = ", ".join(summary_counts(outcome.diff))
            before, after = outcome.diff.totals_before.total, outcome.diff.totals_after.total
            if before != after:
                detail += f"; traffic {human_bytes(before)} → {human_bytes(after)} ({delta_text(before, after)})"

            cost = cost_headline(outcome.diff.cost_before, outcome.diff.cost_after, "the golden")
            if cost:
                detail += f"; {cost}"
        lines.append(f"| {md_escape(outcome.case_id)} | {outcome.status} | {md_escape(detail)} |")
    lines += ["", *(md_escape(hint) for hint in summary.hints)]
    for outcome in outcomes:
        if outcome.status == "changed" and outcome.diff is not None:
            lines += ["", "---", "", f"#### {md_escape(outcome.case_id)}", ""]
            lines += render_markdown(outcome.diff).splitlines()[1:]
    return "\n".join(lines).rstrip() + "\n"
