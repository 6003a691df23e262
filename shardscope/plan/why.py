"""`why`: the collective rows of a plan that match a question, biggest traffic first, with their causes."""

from __future__ import annotations

from dataclasses import dataclass

from shardscope.errors import ShardscopeError, unknown_name
from shardscope.hlo.collectives import COLLECTIVE_OPS
from shardscope.plan.document import Plan
from shardscope.plan.records import CollectiveRow

__all__ = ["WhyRow", "why_rows"]


@dataclass(frozen=True)
class WhyRow:
    """A collective row that answers, with its estimated seconds per step (None: the plan is not priced)."""

    row: CollectiveRow
    seconds: float | None


def _axes(text: str, plan: Plan) -> frozenset[str]:
    axes = frozenset(a.strip() for a in text.replace("+", ",").split(",") if a.strip())
    known = [axis for axis, _ in plan.case.mesh]
    for axis in sorted(axes):
        if axis not in known:
            raise ShardscopeError(f"--axes: {unknown_name('mesh axis', axis, known).args[0]}")
    return axes


def why_rows(
    plan: Plan, op: str | None = None, axes: str | None = None, source: str | None = None
) -> tuple[WhyRow, ...]:
    """The rows of `plan` that match: op (`all-gather`), mesh axes (`fsdp` or `fsdp,expert`: exactly those),
    source (a module path prefix like `decoder/moe_layers`, or a model file such as `moe.py` / `moe.py:81`);
    largest traffic first.

    Raises:
      ShardscopeError: the plan records no causes, or an unknown op or mesh axis.
    """
    if "collectives" not in plan.parts:
        raise ShardscopeError(
            "this plan holds tensors only (made with --tensors-only): it has no collectives to explain"
        )
    if plan.collectives and all(row.cause is None for row in plan.collectives):
        raise ShardscopeError(
            "this plan records no causes (made before causes were recorded, imported from MaxText's dump, or read"
            " from bare HLO); make it again with `shardscope dump`"
        )
    if op is not None and op not in COLLECTIVE_OPS:
        raise unknown_name("collective op", op, COLLECTIVE_OPS)
    wanted = _axes(axes, plan) if axes is not None else None
    times = [r.seconds for r in plan.estimate.rows] if plan.estimate is not None else [None] * len(plan.collectives)
    found = []
    for row, seconds in zip(plan.collectives, times, strict=True):
        if op is not None and row.op != op:
            continue
        if wanted is not None and frozenset(row.axes or ()) != wanted:
            continue
        if source is not None and not _from(row, source):
            continue
        found.append(WhyRow(row, seconds))
    return tuple(sorted(found, key=lambda w: -(w.row.traffic or 0)))


def _from(row: CollectiveRow, source: str) -> bool:
    """A module path prefix of the row's source, or the model file (and line) of the op it reshards for."""
    if row.source == source or row.source.startswith(source.rstrip("/") + "/"):
        return True
    line = row.cause.line if row.cause else None
    if line is None:
        return False
    file, _, number = line.rpartition(":")
    wanted_file, _, wanted_number = source.partition(":")
    if wanted_number and wanted_number != number:
        return False
    return file == wanted_file or file.endswith("/" + wanted_file)
