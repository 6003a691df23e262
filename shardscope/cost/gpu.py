"""A GPU cluster's plan priced on its GPUs' published figures: each collective row by NCCL's bus-bandwidth
model over NVLink or the network, compute at peak FLOP/s and HBM bandwidth, and memory against capacity.

Uncalibrated: the fitted constants of the hardware table's `calibration` come from TPU runs alone, and none
applies here. Every figure is a peak figure × the table's `efficiency`, and the estimate's route says so.

NCCL's model (nccl-tests, `doc/PERFORMANCE.md`): a collective of a buffer of S bytes over n GPUs moves
S × (n−1)/n per GPU for an all-gather, reduce-scatter or all-to-all, 2 × S × (n−1)/n for an all-reduce (ring),
and S for a send/receive (collective-permute), at the bus bandwidth of the slowest link on the way: NVLink
inside a domain, the GPU's NIC across domains (a row that spans both is priced at the NIC: its hierarchical
form still sends its share through it). Latency is not modelled (no published figure): a floor for small
messages. The expected step is the longer of the compute (the whole step's roofline: FLOPs at peak, a quantized
step's float8 matmuls at the fp8 peak, bytes at HBM bandwidth) and the collectives, as XLA's GPU scheduler
overlaps them: the full-overlap bound.
"""

from __future__ import annotations

import math
from collections import defaultdict

from shardscope.case.gpu import GpuHardware, load_gpu_hardware, parse_gpu_cluster
from shardscope.case.hardware import table_source
from shardscope.plan.document import Plan
from shardscope.plan.estimate import GPU_COMPILER, ComputeTime, Estimate, MemoryEstimate, RowTime
from shardscope.plan.records import CollectiveRow, axes_label

UNCALIBRATED = "uncalibrated: no GPU run in the fitting set"
SOURCES = "NVIDIA datasheets (hardware table `gpus`); NCCL's bus-bandwidth model"
OVERLAPPED = "whole-step roofline and collectives overlapped (the longer of the two), uncalibrated"
_FACTOR = {
    "all-gather": lambda n: (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n,
    "ragged-all-to-all": lambda n: (n - 1) / n,
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "collective-permute": lambda n: 1.0,
    "collective-broadcast": lambda n: 1.0,
}


def gpu_route(hardware: GpuHardware) -> str:
    """ "GPU compile priced as h100 (uncalibrated: …)": what every figure of the estimate is."""
    return f"GPU compile priced as {hardware.name} ({UNCALIBRATED})"


def price_gpu_row(row: CollectiveRow, mesh: dict[str, int], hardware: GpuHardware) -> RowTime:
    """One row's time per step: bytes × NCCL's factor over the link it crosses, × count × loop trips."""
    if row.axes is None or row.link is None:
        return RowTime(None, 0.0, 0.0, "groups match no mesh axes")
    if row.op not in _FACTOR:
        return RowTime(None, 0.0, 0.0, f"no time model for {row.op}")
    members = math.prod(mesh.get(axis, 1) for axis in row.axes)
    if members <= 1:
        return RowTime(0.0, 0.0, 0.0)
    bandwidth = hardware.nvlink_bandwidth if row.link == "nvlink" else hardware.network_bandwidth
    transfer = row.bytes * _FACTOR[row.op](members) / bandwidth
    if row.loop_trips is None:
        return RowTime(None, 0.0, transfer, "unknown loop trip count")
    return RowTime(transfer / hardware.efficiency * row.count * row.loop_trips, 0.0, transfer)


def gpu_memory(plan: Plan, hardware: GpuHardware) -> MemoryEstimate:
    """The GPU compiler's figures per device (arguments, outputs not aliasing an argument, temporaries), whose
    sum (buffers alive at different times counted together: an upper bound) is held against HBM capacity."""
    memory = dict(plan.memory)
    categories = {
        "arguments": memory.get("argument_bytes", 0),
        "outputs": max(0, memory.get("output_bytes", 0) - memory.get("alias_bytes", 0)),
        "temp": memory.get("temp_bytes", 0),
    }
    return MemoryEstimate(tuple(sorted(categories.items())), hardware.hbm_bytes, GPU_COMPILER)


def flops_seconds(plan: Plan, flops: int, hardware: GpuHardware) -> float:
    """The step's FLOPs at peak: those of matmuls of two float8 inputs (the work profile's `fp8` bins) at the
    GPU's fp8 peak, the rest at its bf16 peak."""
    fp8 = min(flops, sum(b.flops for b in plan.work if b.precision == "fp8"))
    rate = hardware.efficiency
    return (flops - fp8) / (hardware.peak_bf16_flops * rate) + fp8 / (hardware.peak_flops("fp8") * rate)


def estimate_gpu_plan(plan: Plan, hardware: GpuHardware | None = None) -> Estimate:
    """The estimate of a plan compiled for a GPU cluster (`h100-2x8`), on that cluster's GPUs.

    Raises:
      ShardscopeError: the plan's topology is not a GPU cluster; HardwareError: a broken table entry.
    """
    cluster = parse_gpu_cluster(plan.case.topology)
    hardware = hardware or load_gpu_hardware(cluster.generation)
    mesh = dict(plan.case.mesh)
    rows = tuple(price_gpu_row(row, mesh, hardware) for row in plan.collectives)
    by_axes: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    by_pass: dict[str, float] = defaultdict(float)
    for row, time in zip(plan.collectives, rows, strict=True):
        if time.seconds is None or row.axes == ():
            continue
        by_axes[f"{axes_label(row)} ({'NVLink' if row.link == 'nvlink' else 'network'})"] += time.seconds
        by_op[row.op] += time.seconds
        by_pass[row.pass_] += time.seconds
    compute = dict(plan.compute)
    flops, nbytes = compute.get("flops"), compute.get("bytes_accessed")
    communication = sum(t.seconds for t in rows if t.seconds is not None)
    compute_time = ComputeTime(
        flops=None if flops is None else float(flops),
        bytes_accessed=None if nbytes is None else float(nbytes),
        flops_seconds=flops_seconds(plan, flops or 0, hardware),
        memory_seconds=(nbytes or 0.0) / (hardware.hbm_bandwidth * hardware.efficiency),
    )
    return Estimate(
        hardware=hardware.name,
        slice_shape=(cluster.hosts, cluster.gpus_per_host),
        slices=1,
        layout_source="NVLink domain first, then the network",
        efficiency=hardware.efficiency,
        efficiency_source=f"hardware table, {UNCALIBRATED}",
        figures_source=f"{table_source()} ({SOURCES})",
        rows=rows,
        cross_slice=(),
        by_axes=tuple(sorted(by_axes.items())),
        by_op=tuple(sorted(by_op.items())),
        by_pass=tuple(sorted(by_pass.items())),
        communication=communication,
        unpriced_rows=sum(1 for t in rows if t.seconds is None),
        compute=compute_time,
        memory=gpu_memory(plan, hardware),
        # Where the compile counted the step's work: XLA's GPU scheduler runs the collectives asynchronously
        # (latency-hiding scheduler, pipelined gathers and reduce-scatters), so the step is taken as the longer
        # of the two, the lower bound.
        expected=None if flops is None else max(compute_time.seconds, communication),
        expected_method=None if flops is None else OVERLAPPED,
        route=gpu_route(hardware),
    )
