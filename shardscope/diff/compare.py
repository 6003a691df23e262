"""Presets side by side: one row per figure (traffic per axis, op and pass, memory, tensor bytes), one column
per plan, the best value of each row marked. Built with pandas from the plans' own tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardscope.plan.document import Plan
from shardscope.plan.frames import GROUPINGS, collectives_frame, tensors_frame

# The label of the rows whose groups belong to no mesh axis.
UNMATCHED = "(groups of no mesh axes)"
# Sections whose values are seconds (the rest are bytes).
TIME_SECTIONS = frozenset(("estimated time", "estimated time per mesh axis"))


@dataclass(frozen=True)
class ComparisonRow:
    """One figure across the compared plans: None where a plan has no such figure."""

    section: str
    label: str
    values: tuple[float | None, ...]
    best: tuple[int, ...]  # indexes of the plans with the lowest value (ties share it)


@dataclass(frozen=True)
class Comparison:
    """Plans side by side (`names` label the columns: the presets, or the case where presets repeat)."""

    names: tuple[str, ...]
    plans: tuple[Plan, ...]
    rows: tuple[ComparisonRow, ...]

    def to_json(self) -> dict[str, Any]:
        """{"columns": [...], "rows": [{section, label, values, best}]}."""
        return {
            "columns": list(self.names),
            "meshes": [dict(plan.case.mesh) for plan in self.plans],
            "rows": [
                {
                    "section": r.section,
                    "label": r.label,
                    "values": list(r.values),
                    "best": [self.names[i] for i in r.best],
                }
                for r in self.rows
            ],
        }

    def frame(self) -> Any:
        """The comparison as a pandas DataFrame: index (section, label), one column per plan."""
        import pandas as pd  # lazy: pandas loads on first use

        index = pd.MultiIndex.from_tuples([(r.section, r.label) for r in self.rows], names=["section", "figure"])
        return pd.DataFrame([list(r.values) for r in self.rows], index=index, columns=list(self.names))


def _best(values: Sequence[float | None]) -> tuple[int, ...]:
    present = [v for v in values if v is not None]
    if len(present) < 2 or min(present) == max(present):
        return ()  # nothing to choose between
    low = min(present)
    return tuple(i for i, v in enumerate(values) if v == low)


def _section_rows(section: str, table: Any, columns: Sequence[str]) -> list[ComparisonRow]:
    """Rows of one section from a (figure × plan) pivot table; a missing figure is 0 if the plan has the
    section at all (no traffic over an axis is no traffic), None otherwise."""
    rows = []
    for label, series in table.iterrows():
        values = tuple(None if value != value else float(value) for value in (series.get(c) for c in columns))
        rows.append(ComparisonRow(section, str(label), values, _best(values)))
    return rows


def compare_plans(plans: Sequence[Plan], names: Sequence[str] | None = None) -> Comparison:
    """Lays plans side by side. `names` default to the plans' presets."""
    import pandas as pd  # lazy: pandas loads on first use

    names = tuple(names or (plan.case.preset for plan in plans))
    traffic = []
    for name, plan in zip(names, plans, strict=True):
        frame = collectives_frame(plan)
        frame = frame[frame["moves_data"] & frame["traffic"].notna()].copy()
        frame["plan"] = name
        # Device groups that match no mesh axes are one row here (their patterns are in each plan).
        unmatched = [row.axes is None for row in plan.collectives]
        frame.loc[[i for i in frame.index if unmatched[i]], "axes"] = UNMATCHED
        traffic.append(frame)
    moves = pd.concat(traffic, ignore_index=True) if traffic else pd.DataFrame()
    # What decides between presets leads: the estimated step and HBM need (when priced), then what they move.
    rows: list[ComparisonRow] = _estimate_rows(plans, names)
    compiled = [plan.holds("collectives") for plan in plans]
    if any(compiled):
        totals = tuple(
            float(moves.loc[moves["plan"] == name, "traffic"].sum()) if has else None
            for name, has in zip(names, compiled, strict=True)
        )
        rows.append(ComparisonRow("traffic", "total", totals, _best(totals)))
        for section, grouping in (
            ("traffic per mesh axis", "axis"),
            ("traffic per op", "op"),
            ("traffic per pass", "pass"),
        ):
            pivot = moves.pivot_table(index=GROUPINGS[grouping], columns="plan", values="traffic", aggfunc="sum")
            pivot = pivot.reindex(columns=list(names)).fillna(0.0)
            for i, has in enumerate(compiled):
                if not has:
                    pivot[names[i]] = float("nan")
            rows += _section_rows(section, pivot, names)
    memory = pd.DataFrame(
        {name: dict(plan.memory) for name, plan in zip(names, plans, strict=True) if plan.holds("memory")}
    )
    if not memory.empty:
        memory.index = [str(i).removesuffix("_bytes") for i in memory.index]
        rows += _section_rows("memory (compiler)", memory.reindex(columns=list(names)), names)
    kinds = pd.DataFrame(
        {
            name: tensors_frame(plan).groupby("kind")["bytes_per_device"].sum()
            for name, plan in zip(names, plans, strict=True)
        }
    )
    rows += _section_rows("tensor bytes", kinds.reindex(columns=list(names)).fillna(0.0), names)
    return Comparison(names=names, plans=tuple(plans), rows=tuple(rows))


def _estimate_rows(plans: Sequence[Plan], names: Sequence[str]) -> list[ComparisonRow]:
    """Estimated time (step bounds, communication, compute, per mesh axis) and HBM need of the priced plans."""
    import pandas as pd  # lazy: pandas loads on first use

    estimates = {name: plan.estimate for name, plan in zip(names, plans, strict=True) if plan.estimate is not None}
    if not estimates:
        return []

    def known(value: float, estimate: Any) -> float | None:
        return value if estimate.compute.flops is not None else None

    totals = pd.DataFrame(
        {
            name: {
                "step, expected": e.expected,
                "step, not hidden": known(e.step_no_overlap, e),
                "step, hidden": known(e.step_full_overlap, e),
                "communication": e.communication,
                "compute": known(e.compute.seconds, e),
            }
            for name, e in estimates.items()
        }
    )
    totals = totals.dropna(how="all")
    axes = pd.DataFrame({name: dict(e.by_axes) for name, e in estimates.items()})
    memory = pd.DataFrame(
        {name: {**dict(e.memory.categories), "total": e.memory.total} for name, e in estimates.items()}
    )
    rows = _section_rows("estimated time", totals.reindex(columns=list(names)), names)
    rows += _section_rows("estimated HBM need", memory.reindex(columns=list(names)), names)
    rows += _section_rows("estimated time per mesh axis", axes.reindex(columns=list(names)).fillna(0.0), names)
    return rows
