"""An Estimate as plain JSON data (the plan's `estimate` section) and back, exactly.

Derived figures (step bounds, memory total, fits/over, compute bound) are written for readers of the JSON
and recomputed on reading, so a hand-edited file cannot disagree with itself. Keys are plain strings and
every value is a JSON scalar, list or object: `json.dumps(..., sort_keys=True)` is deterministic.
"""

from __future__ import annotations

from typing import Any

from shardscope.errors import PlanError
from shardscope.plan.estimate import ComputeTime, Estimate, MemoryEstimate, PricedRow, RowTime
from shardscope.plan.records import CollectiveRow


def _time_to_json(time: RowTime) -> dict[str, Any]:
    data: dict[str, Any] = {"seconds": time.seconds, "latency": time.latency, "transfer": time.transfer}
    if time.unpriced is not None:
        data["unpriced"] = time.unpriced
    return data


def _time_from_json(data: dict[str, Any]) -> RowTime:
    seconds = data["seconds"]
    return RowTime(
        seconds=None if seconds is None else float(seconds),
        latency=float(data["latency"]),
        transfer=float(data["transfer"]),
        unpriced=data.get("unpriced"),
    )


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


def _cross_from_json(data: dict[str, Any]) -> PricedRow:
    row = CollectiveRow(
        op=str(data["op"]),
        axes=tuple(data["axes"]) if data["axes"] is not None else None,
        dtype=str(data["dtype"]),
        shape=(),
        bytes=int(data["bytes"]),
        count=int(data["count"]),
        loop_trips=None if data["loop_trips"] is None else int(data["loop_trips"]),
        pass_=str(data["pass"]),
        source=str(data["source"]),
    )
    return PricedRow(row, _time_from_json(data["time"]))


def _optional_float(value: Any) -> float | None:
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


def estimate_from_json(data: Any, source: str = "estimate") -> Estimate:
    """Reads `estimate_to_json` data back into the same Estimate.

    Raises:
      PlanError: a missing or mistyped field.
    """
    try:
        compute = data["compute"]
        memory = data["memory"]
        categories = memory["categories"]
        return Estimate(
            hardware=str(data["hardware"]),
            slice_shape=tuple(int(d) for d in data["slice_shape"]),
            slices=int(data["slices"]),
            layout_source=str(data["layout_source"]),
            efficiency=float(data["efficiency"]),
            efficiency_source=str(data["efficiency_source"]),
            figures_source=str(data["figures_source"]),
            rows=tuple(_time_from_json(row) for row in data["rows"]),
            cross_slice=tuple(_cross_from_json(row) for row in data["cross_slice"]),
            by_axes=tuple(sorted((str(k), float(v)) for k, v in data["by_axes"].items())),
            by_op=tuple(sorted((str(k), float(v)) for k, v in data["by_op"].items())),
            by_pass=tuple(sorted((str(k), float(v)) for k, v in data["by_pass"].items())),
            communication=float(data["communication"]),
            unpriced_rows=int(data["unpriced_rows"]),
            compute=ComputeTime(
                flops=_optional_float(compute["flops"]),
                bytes_accessed=_optional_float(compute["bytes_accessed"]),
                flops_seconds=float(compute["flops_seconds"]),
                memory_seconds=float(compute["memory_seconds"]),
                per_op_seconds=_optional_float(compute.get("per_op_seconds")),
            ),
            expected=_optional_float(data.get("step", {}).get("expected")),
            expected_method=data.get("step", {}).get("expected_method"),
            route=str(data.get("route", "")),
            memory=MemoryEstimate(
                categories=tuple((str(name), int(categories[name])) for name in memory["order"]),
                capacity=int(memory["capacity"]),
                source=str(memory["source"]),
            ),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise PlanError(f"{source}: corrupt estimate ({type(err).__name__}: {err})") from None


def _count(value: float | None) -> int | float | None:
    """A count as the integer it is, however it was computed: one spelling whichever way a plan was made."""
    return int(value) if value is not None and float(value).is_integer() else value
