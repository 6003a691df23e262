"""What a plan costs on a target TPU, as records: the plan's `estimate` section (ARCHITECTURE.md).

`shardscope.cost` computes them from a plan and a hardware table; `shardscope.plan.estimate_json` writes
and reads them. Derived figures (step bounds, the roofline, memory totals) are properties, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardscope.plan.records import CollectiveRow

# Where a memory need comes from: the TPU compiler's own figures, or the tensors' estimate (a floor).
EXACT = "tpu compiler"
ESTIMATED = "estimated from tensors (named tensors only)"
# A GPU compile's figures: the GPU compiler reports no peak, so their sum (an upper bound) is held against capacity.
GPU_COMPILER = "gpu compiler (static sum of its figures)"


@dataclass(frozen=True)
class ComputeTime:
    """Roofline time of a device's FLOPs and HBM traffic."""

    flops: float | None
    bytes_accessed: float | None
    flops_seconds: float  # at peak bf16 FLOP/s
    memory_seconds: float  # at peak HBM bandwidth
    # Every op of the compiled step priced on its own at the calibrated efficiencies (`shardscope.cost.step`);
    # None for plans without a work profile (tensors-only, or written before profiles were recorded).
    per_op_seconds: float | None = None

    @property
    def roofline_seconds(self) -> float:
        """The whole-step roofline at peak: whichever of compute and memory traffic takes longer."""
        return max(self.flops_seconds, self.memory_seconds)

    @property
    def seconds(self) -> float:
        """The compute time: the per-op sum where the plan has a profile, else the whole-step roofline."""
        return self.roofline_seconds if self.per_op_seconds is None else self.per_op_seconds

    @property
    def bound(self) -> str:
        """ "compute" or "memory": which side of the roofline the step is on."""
        return "compute" if self.flops_seconds >= self.memory_seconds else "memory"


@dataclass(frozen=True)
class MemoryEstimate:
    """HBM bytes per device by category, their total, and the capacity they must fit."""

    categories: tuple[tuple[str, int], ...]
    capacity: int
    source: str  # EXACT, ESTIMATED or GPU_COMPILER

    @property
    def total(self) -> int:
        """The per-device need: the sum of the categories."""
        return sum(size for _, size in self.categories)

    @property
    def exact(self) -> bool:
        """Whether the total is the TPU compiler's own figure."""
        return self.source == EXACT

    @property
    def fits(self) -> bool:
        """Whether the step fits the device's HBM. From a TPU compile for this generation, always: the TPU
        compiler refuses a step it cannot fit, so one that compiled fits, even where the static sum of its
        figures (which counts buffers alive at different times together) is above capacity. Otherwise the
        estimate against capacity."""
        return self.exact or self.total <= self.capacity

    @property
    def over(self) -> int:
        """Bytes beyond capacity (0 when it fits)."""
        return 0 if self.fits else self.total - self.capacity


@dataclass(frozen=True)
class RowTime:
    """The estimated time of one collective row per step."""

    seconds: float | None  # (latency + transfer / efficiency) × count × loop_trips; None: unpriced
    latency: float  # one execution
    transfer: float  # one execution at the full modelled bandwidth
    unpriced: str | None = None  # why there is no time


@dataclass(frozen=True)
class PricedRow:
    """A row the plan does not hold (traffic between slices), with its time."""

    row: CollectiveRow
    time: RowTime


# How `Estimate.expected` was reached.
PER_OP = "per-op roofline, collectives overlapped per loop body"


@dataclass(frozen=True)
class Estimate:
    """What a plan costs on one target: communication, compute, step bounds and memory."""

    hardware: str
    slice_shape: tuple[int, ...]
    slices: int
    layout_source: str  # "devices" or "standard slice"
    efficiency: float
    efficiency_source: str  # "hardware table" or "caller"
    figures_source: str
    rows: tuple[RowTime, ...]  # aligned with plan.collectives
    cross_slice: tuple[PricedRow, ...]
    by_axes: tuple[tuple[str, float], ...]
    by_op: tuple[tuple[str, float], ...]
    by_pass: tuple[tuple[str, float], ...]
    communication: float  # seconds per step, every priced row
    unpriced_rows: int
    compute: ComputeTime
    memory: MemoryEstimate
    # The single best figure (`shardscope.cost.step`), how it was reached, and from which compile: "TPU
    # compile" or "CPU compile priced as <generation>". None where compute is unknown (tensors-only plans).
    expected: float | None = None
    expected_method: str | None = None
    route: str = ""
    # Seconds per step of the host offload transfers (a remat policy's `offload`: HBM to host memory and
    # back) on the chip's host link: they overlap compute as collectives do, so the bounds hold them too.
    host_transfer: float = 0.0

    @property
    def step_no_overlap(self) -> float:
        """Upper bound: compute, then every collective and host transfer, one after another."""
        return self.compute.seconds + self.communication + self.host_transfer

    @property
    def step_full_overlap(self) -> float:
        """Lower bound: communication and host transfers entirely hidden behind compute (or the reverse)."""
        return max(self.compute.seconds, self.communication + self.host_transfer)
