"""How close a predicted plan comes to the compiled plan of the same case (benchmark and tests share these)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

from shardscope.plan.cpu_only import cpu_only
from shardscope.plan.document import Plan
from shardscope.plan.records import TENSORS_ONLY, CollectiveRow
from shardscope.predict.weights import WEIGHT_USE


def tensors_only(plan: Plan) -> Plan:
    """What `dump --tensors-only` makes of the case: a compiled plan's tensors, nothing compiled."""
    return dataclasses.replace(
        plan, collectives=(), memory=(), compute=(), work=(), estimate=None, findings=(), parts=TENSORS_ONLY
    )


def traffic_per_axes(rows: tuple[CollectiveRow, ...]) -> dict[tuple[str, ...], int]:
    """Bytes per device per step (bytes × count × loop_trips) per mesh-axis set; rows with unknown trips or
    unmatched groups are left out (a prediction has neither), and so are the rows only a CPU compile has
    (`plan.cpu_only`: the prediction is of the TPU program)."""
    out: dict[tuple[str, ...], int] = defaultdict(int)
    for row in rows:
        if row.axes is not None and row.traffic is not None and not cpu_only(row):
            out[row.axes] += row.traffic
    return dict(out)


@dataclass(frozen=True)
class AxesError:
    """Compiled and predicted traffic over one mesh-axis set."""

    axes: tuple[str, ...]
    compiled: int
    predicted: int

    @property
    def error(self) -> float | None:
        """(predicted − compiled) / compiled; None when nothing was compiled over these axes."""
        return None if not self.compiled else (self.predicted - self.compiled) / self.compiled


def axes_errors(compiled: Plan, predicted: Plan) -> tuple[AxesError, ...]:
    """Per mesh-axis set (of either plan, single-device rows left out), the traffic of each."""
    have = traffic_per_axes(compiled.collectives)
    want = traffic_per_axes(predicted.collectives)
    keys = sorted({axes for axes in (*have, *want) if axes})
    return tuple(AxesError(axes, have.get(axes, 0), want.get(axes, 0)) for axes in keys)


def covered_share(compiled: Plan, predicted: Plan) -> float:
    """The share of the compiled traffic whose rows' causes name a tensor some predicted row names."""
    named = {tensor for row in predicted.collectives if row.cause for tensor in row.cause.tensors}
    total = covered = 0
    for row in compiled.collectives:
        traffic = row.traffic or 0
        total += traffic
        if row.cause is not None and named & set(row.cause.tensors):
            covered += traffic
    return covered / total if total else 1.0


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    # The scan's slice of a stacked weight keeps a unit layer dim in some programs ([1, 4, 64, 32]).
    return tuple(size for size in shape if size != 1)


def gather_matches(compiled: Plan, predicted: Plan) -> tuple[int, int]:
    """(matched, predicted) forward weight all-gathers where a layer uses the weight (not at a pipeline's edge,
    nor a lookup's): a match is a compiled forward all-gather over the same axes, of the same shape (unit dims
    aside) and loop trips, whose cause names that weight."""
    compiled_rows = [r for r in compiled.collectives if r.op == "all-gather" and r.pass_ == "forward" and r.cause]
    mine = [
        (r, r.cause.tensors[0])
        for r in predicted.collectives
        if r.op == "all-gather"
        and r.pass_ == "forward"
        and r.cause
        and r.cause.tensors[:1]
        and r.cause.tensors[0].startswith("params/")
        and r.cause.consumer.endswith(WEIGHT_USE)
    ]
    matched = 0
    for row, weight in mine:
        if any(
            other.axes == row.axes
            and _squeezed(other.shape) == _squeezed(row.shape)
            and other.loop_trips == row.loop_trips
            and other.cause is not None
            and weight in other.cause.tensors
            for other in compiled_rows
        ):
            matched += 1
    return matched, len(mine)
