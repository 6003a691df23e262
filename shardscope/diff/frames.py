"""A diff as pandas tables: one row per tensor change and one per collective change."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardscope.diff.kinds import COLLECTIVE_CHANGE_KINDS, TENSOR_CHANGE_KINDS

if TYPE_CHECKING:
    import pandas as pd

    from shardscope.diff.changes import PlanDiff


def tensor_changes_frame(diff: PlanDiff) -> pd.DataFrame:
    """One row per tensor that changed: path, kind of change, kind of tensor, spec and bytes before/after."""
    import pandas as pd  # lazy: pandas loads on first use

    rows = []
    for change in diff.of_kind(*TENSOR_CHANGE_KINDS):
        before, after = change.tensor_sides
        rows.append(
            {
                "path": change.subject,
                "change": change.kind,
                "kind": change.tensor.kind,
                "spec_before": None if before is None else before.spec,
                "spec_after": None if after is None else after.spec,
                "bytes_before": None if before is None else before.bytes_per_device,
                "bytes_after": None if after is None else after.bytes_per_device,
                "dims": "; ".join(f"dim {d.dim} +{d.axes_added} -{d.axes_dropped}" for d in change.dims),
            }
        )
    columns = ["path", "change", "kind", "spec_before", "spec_after", "bytes_before", "bytes_after", "dims"]
    return pd.DataFrame(rows, columns=columns)


def collective_changes_frame(diff: PlanDiff) -> pd.DataFrame:
    """One row per collective row added, removed or changed, with its traffic before and after."""
    import pandas as pd  # lazy: pandas loads on first use

    rows = []
    for change in diff.of_kind(*COLLECTIVE_CHANGE_KINDS):
        side = change.collective
        before, after = change.collective_sides
        rows.append(
            {
                "change": change.kind,
                "op": side.op,
                "axes": side.axes_label,
                "pass": side.pass_,
                "source": side.source,
                "traffic_before": None if before is None else before.traffic,
                "traffic_after": None if after is None else after.traffic,
            }
        )
    columns = ["change", "op", "axes", "pass", "source", "traffic_before", "traffic_after"]
    return pd.DataFrame(rows, columns=columns)
