"""Compute time of one device's share of a step: the roofline max(FLOPs / peak, bytes / HBM bandwidth).

The figures come from the compiler: `compiled.cost_analysis()`, which in JAX 0.10 returns a dict (on CPU
and on TPU compiled ahead of time) with `"flops"` and `"bytes accessed"` (TPU adds `"optimal_seconds"`).
They are per device: the module is the SPMD-partitioned one (a 256x512x1024 bf16 matmul reports
2.7e8 FLOPs on one CPU device and 6.7e7 per device on v5p-8's four). XLA counts a while-loop body once,
whatever its trip count (a scan of 10 such layers reports one layer's FLOPs on CPU and on TPU alike), so
for models whose layers are scanned the compute time is a lower bound unless the caller scales it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardscope.case.hardware import Hardware
from shardscope.plan.estimate import ComputeTime


def compute_time(hardware: Hardware, flops: float | None, bytes_accessed: float | None) -> ComputeTime:
    """Roofline time of one device's `flops` and `bytes_accessed` (either may be unknown: None → 0 s)."""
    return ComputeTime(
        flops=flops,
        bytes_accessed=bytes_accessed,
        flops_seconds=(flops or 0.0) / hardware.flops_per_device,
        memory_seconds=(bytes_accessed or 0.0) / hardware.hbm_bandwidth_per_device,
    )


def cost_figures(analysis: Any) -> tuple[float | None, float | None]:
    """(flops, bytes accessed) from `compiled.cost_analysis()` (a dict, or a one-element list of dicts
    as older JAX returned); None where the compiler gave none."""
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else None
    if not isinstance(analysis, Mapping):
        return None, None
    flops = analysis.get("flops")
    nbytes = analysis.get("bytes accessed")
    return (None if flops is None else float(flops)), (None if nbytes is None else float(nbytes))
