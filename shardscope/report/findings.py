"""Lint findings for the terminal: a table (severity, lint, subject, message and fix) and a count line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shardscope.case.lints import LINTS
from shardscope.plan.findings import Finding, count_by_severity
from shardscope.report.layout import FitToWidth, column_widths, elide_middle

if TYPE_CHECKING:
    from shardscope.diff.changes import Change

SEVERITY_STYLES = {"error": "bold red", "warning": "yellow", "info": "cyan"}
# How diff reports mark a finding a change added, resolved or changed.
FINDING_MARKS = {"finding_added": "+", "finding_resolved": "−", "finding_changed": "~"}
FINDING_VERBS = {"finding_added": "added", "finding_resolved": "resolved", "finding_changed": "changed"}


def count_line(findings: Sequence[Finding]) -> str:
    """ "2 errors, 10 warnings, 5 info" (or "no findings")."""
    if not findings:
        return "no findings"
    counts = count_by_severity(findings)
    words = {"error": "error", "warning": "warning", "info": "info"}
    parts = []
    for severity, count in counts.items():
        if count:
            plural = "s" if count != 1 and severity != "info" else ""
            parts.append(f"{count} {words[severity]}{plural}")
    return ", ".join(parts)


def findings_table(findings: Sequence[Finding], title: str = "Findings") -> FitToWidth:
    """Every finding, most severe first: what it points at, what is wrong and how to fix it."""

    def build(width: int) -> Table:
        table = Table(title=title, title_justify="left", show_edge=False, show_lines=False)
        widths = column_widths(width, {"severity": 8}, {"lint": 1.1, "subject": 2.2, "finding": 4.0})
        for column in ("severity", "lint", "subject", "finding"):
            table.add_column(column, overflow="fold", width=widths[column])
        for finding in findings:
            body = Text(finding.message)
            body.append(f"\nfix: {finding.fix}", style="dim")
            table.add_row(
                Text(finding.severity, SEVERITY_STYLES.get(finding.severity, "")),
                Text(finding.lint),
                Text(elide_middle(finding.subject, widths["subject"])),
                body,
            )
        return table

    return FitToWidth(build)


def findings_summary(findings: Sequence[Finding]) -> Group:
    """The dump summary's findings: the table, then the counts and how to learn more."""
    if not findings:
        return Group(Text("Findings: none", "green"))
    hint = Text(f"{count_line(findings)}; `shardscope lint --explain ID` tells what a lint checks", "dim")
    return Group(findings_table(findings), hint)


def catalogue_table() -> Table:
    """Every lint: id, severity, what it needs, what it reports (`lint --list`)."""
    table = Table(title="Lints", title_justify="left", show_edge=False)
    for column in ("id", "severity", "needs", "reports"):
        table.add_column(column, no_wrap=column != "reports")
    for lint in LINTS.values():
        table.add_row(lint.id, Text(lint.severity, SEVERITY_STYLES[lint.severity]), lint.stage, lint.title)
    return table


def finding_change_text(change: Change) -> str:
    """What a changed finding now says ("was: …" for the old message), or its message."""
    before, _ = change.finding_sides
    side = change.finding
    if change.kind == "finding_changed" and before is not None and before.message != side.message:
        return f"{side.message} (was: {before.message})"
    return side.message


def finding_changes_table(changes: Sequence[Change]) -> FitToWidth:
    """Lint findings a change added (+), resolved (−) or changed (~)."""
    styles = {"finding_added": "red", "finding_resolved": "green", "finding_changed": "yellow"}

    def build(width: int) -> Table:
        table = Table(title="Lint findings", title_justify="left", show_edge=False)
        widths = column_widths(width, {"": 1, "severity": 8}, {"lint": 1.1, "subject": 2.2, "finding": 4.0})
        for column in ("", "severity", "lint", "subject", "finding"):
            table.add_column(column, overflow="fold", width=widths[column])
        for change in changes:
            side = change.finding
            table.add_row(
                Text(FINDING_MARKS[change.kind], styles[change.kind]),
                Text(side.severity, SEVERITY_STYLES.get(side.severity, "")),
                Text(side.lint),
                Text(side.subject),
                Text(finding_change_text(change)),
            )
        return table

    return FitToWidth(build)
