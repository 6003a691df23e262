"""Totals of a plan that reviewers read first: traffic per mesh axis, per op and per pass, bytes per kind
(group-bys over the pandas tables of `shardscope.plan.frames`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardscope.plan.frames import collectives_frame, tensors_frame
from shardscope.plan.records import CollectiveRow

if TYPE_CHECKING:
    from shardscope.plan.document import Plan


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


def traffic_totals(rows: Iterable[CollectiveRow]) -> TrafficTotals:
    """Sums bytes × count × loop_trips per axes, op and pass (group-bys over the collectives table)."""
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
    frame = tensors_frame(plan)
    grouped = frame.groupby("kind", sort=True)["bytes_per_device"].agg(["size", "sum"])
    return tuple((str(kind), int(row["size"]), int(row["sum"])) for kind, row in grouped.iterrows())


def traffic_by_rule(rows: Iterable[CollectiveRow]) -> tuple[tuple[str, int], ...]:
    """Traffic per cause, largest first: each row counted under its rules as one label (`embed → fsdp`,
    `activation_batch → data+fsdp; …`) or "compiler's choice"; () when no row records a cause."""
    sums: dict[str, int] = {}
    for row in rows:
        if row.cause is None or row.axes == () or row.traffic is None:
            continue
        label = row.cause.rules_text
        sums[label] = sums.get(label, 0) + row.traffic
    return tuple(sorted(sums.items(), key=lambda item: (-item[1], item[0])))
