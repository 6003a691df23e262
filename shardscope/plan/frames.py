"""A plan as pandas tables: one row per tensor, one per collective row, and traffic grouped (`table --by`).

A row whose loop trip count is unknown has no traffic (NaN) and is counted apart, and rows whose groups are
single devices move nothing and are left out of the groupings. pandas loads on first use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardscope.case.rules import entry_axes
from shardscope.plan.records import CollectiveRow, axes_label

if TYPE_CHECKING:
    import pandas as pd

    from shardscope.plan.document import Plan

# The groupings `table --by` and the reports know, and the collectives column each one groups by.
GROUPINGS = {"axis": "axes", "op": "op", "pass": "pass", "source": "source", "dtype": "dtype"}
GROUPINGS |= {"rule": "rules", "tensor": "moves"}  # from each row's cause


def spec_axes_text(spec: Sequence[Any]) -> str:
    """`(fsdp+expert, -, -)`: each dimension's mesh axes, `-` where it is replicated."""
    return "(" + ", ".join("+".join(entry_axes(e)) or "-" for e in spec) + ")"


def tensors_frame(plan: Plan) -> pd.DataFrame:
    """One row per tensor: path, kind, shape, dtype, logical axes, spec, per-device shape and bytes."""
    import pandas as pd  # lazy: pandas loads on first use

    rows = [
        {
            "path": path,
            "kind": t.kind,
            "shape": t.shape,
            "dtype": t.dtype,
            "logical": t.logical,
            "spec": t.spec,
            "sharded_over": spec_axes_text(t.spec),
            "shard_shape": t.shard_shape,
            "bytes_per_device": t.bytes_per_device,
        }
        for path, t in plan.tensors
    ]
    columns = ["path", "kind", "shape", "dtype", "logical", "spec", "sharded_over", "shard_shape", "bytes_per_device"]
    return pd.DataFrame(rows, columns=columns)


def collectives_frame(
    plan: Plan | Sequence[CollectiveRow], times: Sequence[float | None] | None = None
) -> pd.DataFrame:
    """One row per collective row: op, axes, pass, source, dtype, shape, bytes, count, loop trips, traffic
    (bytes × count × trips per device per step; NaN when a trip count is unknown), its cause (`moves`: the
    tensors it moves; `needed_by`: the op it reshards for; `line`: that op's model line; `rules`: the rules
    behind its axes or "compiler's choice"; all None in a plan without causes) and, when `times` is
    given (a cost estimate's per-row seconds, in the same order) or the plan carries an estimate, the
    estimated time per step (`time_s`; NaN for a row the cost model could not price)."""
    import pandas as pd  # lazy: pandas loads on first use

    rows = plan.collectives if not isinstance(plan, Sequence) else tuple(plan)
    if times is None and not isinstance(plan, Sequence) and plan.estimate is not None:
        times = [row.seconds for row in plan.estimate.rows]
    data = [
        {
            "op": r.op,
            "axes": axes_label(r),
            "pass": r.pass_,
            "source": r.source,
            "dtype": r.dtype,
            "shape": r.shape,
            "bytes": r.bytes,
            "count": r.count,
            "loop_trips": r.loop_trips,
            "traffic": r.traffic,
            "moves_data": r.axes != (),
            "moves": ", ".join(r.cause.tensors) if r.cause else None,
            "needed_by": r.cause.consumer if r.cause else None,
            "line": r.cause.line if r.cause else None,
            "rules": r.cause.rules_text if r.cause else None,
        }
        for r in rows
    ]
    columns = ["op", "axes", "pass", "source", "dtype", "shape", "bytes", "count", "loop_trips", "traffic"]
    columns += ["moves", "needed_by", "line", "rules"]
    frame = pd.DataFrame(data, columns=[*columns, "moves_data"])
    frame["traffic"] = frame["traffic"].astype("float64")
    frame["moves_data"] = frame["moves_data"].astype(bool)  # an empty object column would select columns
    if times is not None:
        frame["time_s"] = pd.Series(list(times), dtype="float64")
    return frame


def traffic_by(plan: Plan | Sequence[CollectiveRow], by: Sequence[str]) -> pd.DataFrame:
    """Traffic per device per step grouped by `by` (names of GROUPINGS), largest first, with its share (and
    the estimated time, when the plan is priced).

    Raises:
      ValueError: an unknown grouping.
    """
    unknown = [name for name in by if name not in GROUPINGS]
    if unknown:
        raise ValueError(f"unknown grouping {unknown[0]!r} (known: {', '.join(GROUPINGS)})")
    frame = collectives_frame(plan)
    frame = frame[frame["moves_data"] & frame["traffic"].notna()]
    columns = [GROUPINGS[name] for name in by]
    groups = frame.groupby(columns, sort=True, dropna=False)
    grouped = groups["traffic"].agg(["sum", "size"]).reset_index()
    grouped = grouped.rename(columns={"sum": "traffic", "size": "rows"})
    grouped["traffic"] = grouped["traffic"].astype("int64")
    if "time_s" in frame:
        # min_count=1: a group whose rows were all unpriced has no time (NaN), not zero seconds.
        grouped["time_s"] = groups["time_s"].sum(min_count=1).to_numpy()
    total = int(grouped["traffic"].sum())
    grouped["share"] = grouped["traffic"] / total if total else 0.0
    return grouped.sort_values(["traffic", *columns], ascending=[False, *[True] * len(columns)], ignore_index=True)
