"""A preset comparison rendered for the terminal (a table that fits 80 columns) and as one self-contained
HTML page (inline CSS, no script, every value escaped), from the same `Comparison`."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from shardscope.case.topology import mesh_label
from shardscope.diff.compare import TIME_SECTIONS, Comparison, ComparisonRow
from shardscope.plan.units import compact_bytes, human_seconds
from shardscope.report.html import environment
from shardscope.report.layout import FitToWidth

BEST = "*"  # marks the best value of a row, also where colour is not shown


def value_text(value: float | None, section: str = "") -> str:
    """A cell: seconds in the time sections, bytes elsewhere, "—" where the plan has no such figure."""
    if value is None:
        return "—"
    if section in TIME_SECTIONS:
        return human_seconds(value)
    return compact_bytes(int(value))


def comparison_renderable(comparison: Comparison) -> FitToWidth:
    """One table: a row per figure, a column per plan, the best value of each row bold and starred."""

    headers, legend = column_headers(comparison.names)

    def build(width: int) -> Table:
        table = Table(
            title="Presets compared (per device; * = best)",
            title_justify="left",
            show_edge=False,
            caption=legend,
            caption_justify="left",
        )
        # Values need 9 cells ("1009 KiB*"); the figure's name takes what is left, folded.
        columns = len(comparison.names) + 1
        label = max(10, width - 9 * len(comparison.names) - 3 * columns + 1)
        table.add_column("figure", overflow="fold", width=label)
        for header in headers:
            table.add_column(header, justify="right", overflow="fold", width=9)
        section = None
        for row in comparison.rows:
            if row.section != section:
                section = row.section
                table.add_row(Text(section, "bold"), *([""] * len(comparison.names)))
            cells = [
                Text(
                    value_text(v, row.section) + (BEST if i in row.best else " "), "bold green" if i in row.best else ""
                )
                for i, v in enumerate(row.values)
            ]
            table.add_row("  " + row.label, *cells)
        return table

    return FitToWidth(build)


def column_headers(names: list[str] | tuple[str, ...]) -> tuple[list[str], str | None]:
    """The columns' headers and the legend under the table: the names themselves when each fits a 9-cell column,
    else letters, each spelled out in the legend (a MaxText command line folded into 9 cells cannot be read)."""
    if all(len(name) <= 9 for name in names):
        return list(names), None
    letters = [chr(ord("A") + i) if i < 26 else f"#{i + 1}" for i in range(len(names))]
    return letters, "\n".join(f"{letter}: {name}" for letter, name in zip(letters, names, strict=True))


def _row_view(row: ComparisonRow) -> dict[str, Any]:
    present = [v for v in row.values if v is not None]
    top = max(present) if present else 0.0
    return {
        "label": row.label,
        "cells": [
            {
                "text": value_text(v, row.section),
                "best": i in row.best,
                "bar": 0 if v is None or not top else round(100 * v / top),
            }
            for i, v in enumerate(row.values)
        ],
    }


def render_comparison_html(comparison: Comparison, title: str) -> str:
    """The comparison as one HTML page: a table per section, bars scaled to each row's largest value."""
    sections: dict[str, list[dict[str, Any]]] = {}
    for row in comparison.rows:
        sections.setdefault(row.section, []).append(_row_view(row))
    plans = [
        {"name": name, "mesh": mesh_label(plan.case.mesh), "topology": plan.case.topology}
        for name, plan in zip(comparison.names, comparison.plans, strict=True)
    ]
    return environment().get_template("compare.html.j2").render(title=title, plans=plans, sections=sections)
