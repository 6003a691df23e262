"""An Estimate as plain JSON data (the plan's `estimate` section) and back, exactly.

Derived figures (step bounds, memory total, fits/over, compute bound) are written for readers of the JSON
and recomputed on reading, so a hand-edited file cannot disagree with itself. Reading validates with the
estimate's types (`shardscope.plan.schema.EstimateDocument`). Keys are plain strings and
every value is a JSON scalar, list or object: `json.dumps(..., sort_keys=True)` is deterministic.
"""

from __future__ import annotations

from typing import Any

from shardscope.errors import PlanError
from shardscope.plan.estimate import ComputeTime, Estimate, MemoryEstimate, PricedRow, RowTime
from shardscope.plan.records import CollectiveRow
from shardscope.plan.schema import EstimateDocument, validate_document


def _time_to_json(time: RowTime) -> dict[str, Any]:
    data: dict[str, Any] = {"seconds": time.seconds, "latency": time.latency, "transfer": time.transfer}
    if time.unpriced is not None:
        data["unpriced"] = time.unpriced
    return data


def _cross_to_json(priced: PricedRow) -> dict[str, Any]:
    row = priced.row
    return {
        "op": row.op,
        "axes": list(row.axes) if row.axes is not None else None,
        "dtype": row.dtype,
        "bytes": row.bytes,
        "count": row.count,
        "loop_trips": row.loop_trips,
        "pass": row.pass_,
        "source": row.source,
        "time": _time_to_json(priced.time),
    }


def _optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def estimate_to_json(estimate: Estimate) -> dict[str, Any]:
    """The estimate as JSON-able data (seconds, bytes and FLOPs as plain numbers)."""
    compute = estimate.compute
    memory = estimate.memory
    return {
        "hardware": estimate.hardware,
        "slice_shape": list(estimate.slice_shape),
        "slices": estimate.slices,
        "layout_source": estimate.layout_source,
        "efficiency": estimate.efficiency,
        "efficiency_source": estimate.efficiency_source,
        "figures_source": estimate.figures_source,
        "rows": [_time_to_json(time) for time in estimate.rows],
        "cross_slice": [_cross_to_json(priced) for priced in estimate.cross_slice],
        "by_axes": dict(estimate.by_axes),
        "by_op": dict(estimate.by_op),
        "by_pass": dict(estimate.by_pass),
        "communication": estimate.communication,
        "unpriced_rows": estimate.unpriced_rows,
        "compute": {
            "flops": _count(compute.flops),
            "bytes_accessed": _count(compute.bytes_accessed),
            "flops_seconds": compute.flops_seconds,
            "memory_seconds": compute.memory_seconds,
            "seconds": compute.seconds,
            "bound": compute.bound,
            "per_op_seconds": compute.per_op_seconds,
        },
        "step": {
            "no_overlap": estimate.step_no_overlap,
            "full_overlap": estimate.step_full_overlap,
            "expected": estimate.expected,
            "expected_method": estimate.expected_method,
            # written only where there is some, so that plans without host offload read as they always did
            **({"host_transfer": estimate.host_transfer} if estimate.host_transfer else {}),
        },
        "route": estimate.route,
        "memory": {
            "categories": dict(memory.categories),
            "order": [name for name, _ in memory.categories],
            "capacity": memory.capacity,
            "source": memory.source,
            "exact": memory.exact,
            "total": memory.total,
            "fits": memory.fits,
            "over": memory.over,
        },
    }


def estimate_from_document(data: EstimateDocument) -> Estimate:
    """An estimate from its validated JSON (`shardscope.plan.schema.EstimateDocument`)."""
    compute = data["compute"]
    memory = data["memory"]
    step = data.get("step", {})
    cross_slice = tuple(
        PricedRow(
            CollectiveRow(
                op=row["op"],
                axes=None if row["axes"] is None else tuple(row["axes"]),
                dtype=row["dtype"],
                shape=(),
                bytes=row["bytes"],
                count=row["count"],
                loop_trips=row["loop_trips"],
                pass_=row["pass"],
                source=row["source"],
            ),
            row["time"],
        )
        for row in data["cross_slice"]
    )
    missing = [name for name in memory["order"] if name not in memory["categories"]]
    if missing:
        raise PlanError(f"corrupt estimate (memory.order names {missing}, which memory.categories lacks)")
    return Estimate(
        hardware=data["hardware"],
        slice_shape=tuple(data["slice_shape"]),
        slices=data["slices"],
        layout_source=data["layout_source"],
        efficiency=data["efficiency"],
        efficiency_source=data["efficiency_source"],
        figures_source=data["figures_source"],
        rows=tuple(data["rows"]),
        cross_slice=cross_slice,
        by_axes=tuple(sorted(data["by_axes"].items())),
        by_op=tuple(sorted(data["by_op"].items())),
        by_pass=tuple(sorted(data["by_pass"].items())),
        communication=data["communication"],
        unpriced_rows=data["unpriced_rows"],
        compute=ComputeTime(
            flops=_optional_float(compute["flops"]),
            bytes_accessed=_optional_float(compute["bytes_accessed"]),
            flops_seconds=compute["flops_seconds"],
            memory_seconds=compute["memory_seconds"],
            per_op_seconds=compute.get("per_op_seconds"),
        ),
        expected=step.get("expected"),
        expected_method=step.get("expected_method"),
        host_transfer=step.get("host_transfer", 0.0),
        route=data.get("route", ""),
        memory=MemoryEstimate(
            categories=tuple((name, memory["categories"][name]) for name in memory["order"]),
            capacity=memory["capacity"],
            source=memory["source"],
        ),
    )


def estimate_from_json(data: Any, source: str = "estimate") -> Estimate:
    """Reads `estimate_to_json` data back into the same Estimate.

    Raises:
      PlanError: a missing or mistyped field (named in the message).
    """
    try:
        return estimate_from_document(validate_document(EstimateDocument, data, f"{source}: corrupt estimate"))
    except PlanError as err:
        if str(err).startswith("corrupt estimate"):
            raise PlanError(f"{source}: {err}") from None
        raise


def _count(value: float | None) -> int | float | None:
    """A count as the integer it is, however it was computed: one spelling whichever way a plan was made. Taken
    through a float, as the record holds it (and as reading the plan back gives it): a sum of integers past
    2**53 would otherwise be written with digits no plan read back can spell again."""
    return int(float(value)) if value is not None and float(value).is_integer() else value
