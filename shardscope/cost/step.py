"""The expected step time: the compiled step's ops priced one by one, and the collectives (and host
transfers) overlapped with the compute of the same loop body, as the TPU compiler schedules them.

- Compute: each op takes max(matrix FLOPs / (peak × MXU efficiency), HBM bytes / (bandwidth × HBM
  efficiency)); the plan's work profile (`shardscope.hlo.profile`) holds the ops binned by arithmetic
  intensity, so the sum of per-op maxima is taken bin by bin. Attention-kernel ops count their FLOPs only
  (the kernel keeps its scores on chip), at the kernel's own fraction of peak (a flash kernel's blocks of
  scores, softmax and rescaling keep its matrix units far less busy than a large matmul's).
- Overlap: the TPU compiler runs collectives asynchronously and its latency-hiding scheduler moves their
  start away from their use, within the computation that holds them; a loop body's collectives are
  pipelined against the body's own compute. Ops and collective rows are grouped by region: how many times
  the outermost loop body they run in runs per step (a layer loop's trips, a pipeline's iterations, once
  for the code outside loops; a loop nested in a layer, as a windowed matmul's, is the layer's), which
  tells loop bodies apart without naming them (a collective row, which records only its loop trips, goes
  to the region of the ops that run as often as it does). The
  pass is not part of the region: a pipeline's permutes carry no pass in their metadata yet run in the
  loops whose compute hides them. Each region takes max(compute, transfers): the longer hides the other;
  but a hand-off (a collective that passes one iteration's result to the next, all of whose matrix work
  waits for it: a pipeline stage's output going to the next stage) is hidden by nothing and adds to it.
- Host transfers (a remat policy's offload) go over the host link, asynchronously like collectives.

The two bounds stay beside it: communication entirely hidden (max of the totals) and not hidden at all
(their sum); the expected figure lies between them by construction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from shardscope.case.hardware import Hardware
from shardscope.hlo.profile import WorkBin, WorkKind
from shardscope.plan.estimate import RowTime
from shardscope.plan.records import CollectiveRow

Region = int | None  # executions per step (None: a collective row whose loop trips are unknown)


def bin_seconds(entry: WorkBin, hardware: Hardware, cpu_program: bool = False, expert_width: int = 0) -> float:
    """Device time of one bin's ops (host transfers excluded: they are transfers, see `host_seconds`).

    `expert_width`: the hidden width of the experts a `grouped` bin multiplies (`Hardware.grouped_efficiency`).

    `cpu_program`: the ops are a CPU compile's, priced as the TPU would run them. Its profile already
    counts them so (`shardscope.hlo.profile.work_profile`: values of bfloat16 precision at two bytes an
    element, the conversions, relayouts and elementwise ops the TPU does inside its matmuls left out); the
    TPU still fuses more of the other ops without matrix work, which count at the table's
    `cpu_memory_bytes_factor`, and relayouts the rows a dropless MoE's gathers and scatters permute, which
    count at `cpu_gather_bytes_factor` (both fitted to TPU compiles of the same cases by
    benchmarks/calibrate.py). A `buffer` bin holds bytes the TPU moves as counted: no factor."""
    # An 8-bit matmul runs at the chip's peak for its precision, at the same fraction of it.
    peak = hardware.peak_flops_per_device(entry.precision)
    flops_rate = peak * hardware.mxu_efficiency
    if entry.kind == WorkKind.GROUPED:
        flops_rate = peak * hardware.grouped_efficiency(expert_width)
    if entry.kind == WorkKind.KERNEL:
        return entry.flops / (hardware.flops_per_device * (hardware.kernel_efficiency or hardware.mxu_efficiency))
    if entry.kind == WorkKind.HOST:
        return 0.0
    nbytes = float(entry.bytes)
    if cpu_program and entry.kind == WorkKind.MEMORY:
        nbytes *= hardware.cpu_memory_bytes_factor
    elif cpu_program and entry.kind == WorkKind.GATHER:
        nbytes *= hardware.cpu_gather_bytes_factor
    return max(entry.flops / flops_rate, nbytes / (hardware.hbm_bandwidth_per_device * hardware.hbm_efficiency))


def host_seconds(entry: WorkBin, hardware: Hardware) -> float:
    """Time of a bin's host transfers on the chip's host link (0 when the table has no such figure)."""
    bandwidth = hardware.host_bandwidth_per_device
    if entry.kind != WorkKind.HOST or bandwidth is None:
        return 0.0
    return entry.bytes / bandwidth


def per_op_compute(
    work: Iterable[WorkBin], hardware: Hardware, cpu_program: bool = False, expert_width: int = 0
) -> float:
    """The step's compute time, op by op."""
    return sum(bin_seconds(entry, hardware, cpu_program, expert_width) for entry in work)


def tpu_execution(row: CollectiveRow, cpu_program: bool) -> tuple[int, int | None]:
    """(bytes, executions per step) of a collective row as the TPU runs it: a CPU program's row moves the
    bytes its values take on a TPU (`tpu_bytes`), or, an all-reduce the TPU moves out of its loop, the
    accumulated buffers once (`tpu_moved_out`)."""
    if cpu_program and row.tpu_moved_out is not None:
        return row.tpu_moved_out, 1
    return (row.bytes if row.tpu_bytes is None else row.tpu_bytes), row.loop_trips


def expected_step(
    work: Sequence[WorkBin],
    rows: Iterable[tuple[CollectiveRow, RowTime]],
    hardware: Hardware,
    cpu_program: bool = False,
    expert_width: int = 0,
) -> float:
    """Σ over regions of hand-offs + max(compute, other collectives + host transfers) (see the module doc).
    Rows without a time (unpriced) add nothing, as in the bounds."""
    compute: dict[Region, float] = defaultdict(float)
    transfers: dict[Region, float] = defaultdict(float)
    # A collective row records its loop trips, not its loop: it belongs to the region of the ops that run
    # as often as it does.
    region_of: dict[int | None, int] = {}
    for entry in work:
        region = entry.region or entry.executions
        region_of[entry.executions] = max(region_of.get(entry.executions, 0), region)
        compute[region] += bin_seconds(entry, hardware, cpu_program, expert_width)
        transfers[region] += host_seconds(entry, hardware)
    handoffs: dict[Region, float] = defaultdict(float)
    for row, time in rows:
        if time.seconds is None:
            continue
        trips = tpu_execution(row, cpu_program)[1]  # an all-reduce moved out of its loop runs outside it
        placed = region_of.get(trips, trips)
        (handoffs if row.handoff else transfers)[placed] += time.seconds
    regions = compute.keys() | transfers.keys() | handoffs.keys()
    return sum(handoffs[region] + max(compute[region], transfers[region]) for region in regions)
