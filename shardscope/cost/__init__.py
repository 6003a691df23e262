"""What a plan costs on a target TPU: step time and memory, per mesh axis, op and pass.

The map: `layout` (mesh axes → torus dimensions, wraparound, slices), `collective` (alpha-beta time of one
collective on a device group), `compute` (roofline of the compiler's FLOPs and bytes), `memory` (HBM need
against capacity), `dcn` (traffic between slices a per-slice plan does not show), `estimate` (all of it for
one plan) and `price` (a plan on its target). The figures come from the hardware table
(`shardscope.case.hardware`, `hardware.yaml`); the records it fills are the plan's
(`shardscope.plan.estimate`), re-exported here with the table's for the library's users. Importing this
package imports no JAX.
"""

from shardscope.case.hardware import Hardware, HardwareError, known_hardware, load_hardware
from shardscope.cost.collective import CollectiveTime, collective_time
from shardscope.cost.compute import compute_time, cost_figures
from shardscope.cost.dcn import cross_slice_rows
from shardscope.cost.estimate import estimate_plan, price_row
from shardscope.cost.layout import AxisLayout, Layout, Span, default_slice_shape, layout_for, layout_from_mesh
from shardscope.cost.memory import memory_need
from shardscope.cost.price import Target, estimate_of, price_plan, target_for
from shardscope.plan.estimate import ComputeTime, Estimate, MemoryEstimate, PricedRow, RowTime
from shardscope.plan.estimate_json import estimate_from_json, estimate_to_json

__all__ = [
    "AxisLayout",
    "CollectiveTime",
    "ComputeTime",
    "Estimate",
    "Hardware",
    "HardwareError",
    "Layout",
    "MemoryEstimate",
    "PricedRow",
    "RowTime",
    "Span",
    "Target",
    "collective_time",
    "compute_time",
    "cost_figures",
    "cross_slice_rows",
    "default_slice_shape",
    "estimate_from_json",
    "estimate_of",
    "estimate_plan",
    "estimate_to_json",
    "known_hardware",
    "layout_for",
    "layout_from_mesh",
    "load_hardware",
    "memory_need",
    "price_plan",
    "price_row",
    "target_for",
]
