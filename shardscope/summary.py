"""Totals of a plan that reviewers read first: traffic per mesh axis, per op and per pass, bytes per kind."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from shardscope.plan import CollectiveRow, Plan


@dataclass(frozen=True)
class TrafficTotals:
    """Bytes moved per device per step, grouped three ways.

    Rows with unknown trip counts are counted apart, and rows whose groups are single devices (a
    collective over mesh axes of size 1) are left out: they move nothing.
    """

    by_axes: tuple[tuple[str, int], ...]
    by_op: tuple[tuple[str, int], ...]
    by_pass: tuple[tuple[str, int], ...]
    total: int
    unknown_trip_rows: int


def axes_label(row: CollectiveRow) -> str:
    """ "fsdp+expert", "(single device)" for singleton groups, or a summary of device groups that match no
    mesh axes (the whole list, which can run to thousands of characters, stays in the plan JSON)."""
    if row.axes is None:
        return groups_summary(row.groups) if row.groups else "(unmatched)"
    return "+".join(row.axes) if row.axes else "(single device)"


_NUMBER = re.compile(r"\d+")


def groups_summary(groups: str) -> str:
    """A short description of device groups that match no mesh axes.

    "{{0,1},{2,3}}" → "groups: 2 × 2 devices"; "{0->1,1->2,2->0}" → "groups: 3 pairs, shift +1, -2" (the
    commonest shifts; a ring's wrap-around pair is the second).
    """
    if "->" in groups:
        pairs = [tuple(int(n) for n in _NUMBER.findall(pair)) for pair in groups.strip("{}").split(",") if pair]
        shifts = Counter(target - source for source, target in pairs if len((source, target)) == 2)
        common = ", ".join(f"{shift:+d}" for shift, _ in shifts.most_common(2))
        more = f" and {len(shifts) - 2} more" if len(shifts) > 2 else ""
        return f"groups: {len(pairs)} pairs, shift {common}{more}"
    members = [len(_NUMBER.findall(group)) for group in re.findall(r"\{([^{}]*)\}", groups)]
    sizes = Counter(members)
    if len(sizes) == 1:
        (size, count), *_ = sizes.items()
        return f"groups: {count} × {size} devices"
    return f"groups: {len(members)} of {min(members)}–{max(members)} devices"


def traffic_totals(rows: Iterable[CollectiveRow]) -> TrafficTotals:
    """Sums bytes × count × loop_trips per axes, op and pass (group-bys over the collectives table)."""
    from shardscope.tables import collectives_frame

    frame = collectives_frame(tuple(rows))
    moving = frame[frame["moves_data"]]
    known = moving[moving["traffic"].notna()]

    def per(column: str) -> tuple[tuple[str, int], ...]:
        sums = known.groupby(column, sort=True)["traffic"].sum()
        return tuple((str(name), int(value)) for name, value in sums.items())

    return TrafficTotals(
        by_axes=per("axes"),
        by_op=per("op"),
        by_pass=per("pass"),
        total=int(known["traffic"].sum()),
        unknown_trip_rows=int(moving["traffic"].isna().sum()),
    )


def bytes_by_kind(plan: Plan) -> tuple[tuple[str, int, int], ...]:
    """(kind, tensor count, bytes per device) per tensor kind (a group-by over the tensors table)."""
    from shardscope.tables import tensors_frame

    frame = tensors_frame(plan)
    grouped = frame.groupby("kind", sort=True)["bytes_per_device"].agg(["size", "sum"])
    return tuple((str(kind), int(row["size"]), int(row["sum"])) for kind, row in grouped.iterrows())


def human_bytes(count: int | None) -> str:
    """1536 → "1.5 KiB"."""
    if count is None:
        return "?"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def compact_bytes(count: int | None) -> str:
    """Three significant digits at most, for narrow columns: 1536 → "1.5 KiB", 1033472 → "1009 KiB"."""
    if count is None:
        return "?"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}" if abs(value) < 10 else f"{value:.0f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
