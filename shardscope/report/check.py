"""A `check` or `update` for the terminal: one row per golden case."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from shardscope.golden.check import CaseOutcome


def outcome_table(outcomes: Sequence[CaseOutcome]) -> Table:
    """One row per golden case: its status (coloured) and what changed, or why it could not be checked."""
    styles = {"same": "green", "unchanged": "green", "created": "cyan", "updated": "cyan"}
    table = Table(show_edge=False)
    for column in ("case", "status", "detail"):
        table.add_column(column)
    for outcome in outcomes:
        detail = outcome.message
        if outcome.diff is not None and not outcome.diff.same:
            kinds: dict[str, int] = {}
            for change in outcome.diff.changes:
                kinds[change.kind] = kinds.get(change.kind, 0) + 1
            detail = ", ".join(f"{count} {kind.replace('_', ' ')}" for kind, count in sorted(kinds.items()))
        style = styles.get(outcome.status, "yellow" if outcome.status == "skipped" else "red")
        # Text, not markup: a detail like "pip install 'shardscope[tpu]'" must print as written.
        table.add_row(Text(outcome.case_id), Text(outcome.status, style), Text(detail))
    return table
