"""What a verification found, as plain records: each tensor compared, each divergence with where the tensor
lives on both sides and the collectives that touch it, and the report `verify --json` prints."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

SCHEMA = "shardscope.verify/1"
# What `--against` (and a golden case's `verify:`) takes for the single-device reference.
AGAINST_ONE_DEVICE = "one-device"
# What a compared tensor is, in the order a train step computes them (a program's outputs are `output`).
KINDS = ("loss", "gradient", "parameter", "first moment", "second moment", "state", "output")


@dataclass(frozen=True)
class TensorCheck:
    """One tensor of one step compared: its largest absolute difference, that difference relative to the
    tensor's largest reference value, the allowed difference where the two came closest to it (`tolerance`)
    and how close (`ratio` = difference / allowed there; above 1 is a divergence)."""

    step: int  # 1-based
    tensor: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    max_abs_error: float
    max_rel_error: float
    tolerance: float
    ratio: float

    @property
    def diverged(self) -> bool:
        """Whether some element differs by more than it may."""
        return self.ratio > 1.0


@dataclass(frozen=True)
class CollectiveNote:
    """A collective of a side's compiled plan that moves (or sums) the tensor, and the model line behind it."""

    op: str
    axes: str
    pass_: str
    consumer: str
    line: str | None


@dataclass(frozen=True)
class Placement:
    """Where a tensor lives on one side: its sharding (`(fsdp+expert, -)`, or `one device`) and the collectives
    of that side's plan that touch it (a preset side's; a program of one's own records no causes)."""

    side: str
    spec: str
    collectives: tuple[CollectiveNote, ...] = ()


@dataclass(frozen=True)
class Divergence:
    """A tensor that differs by more than it may, where it lives on each side, and the model lines of the
    collectives that touch it."""

    check: TensorCheck
    placements: tuple[Placement, ...]
    lines: tuple[str, ...]


@dataclass(frozen=True)
class StepLoss:
    """One step's loss on both sides (a train step's)."""

    step: int
    loss: float
    reference: float


@dataclass(frozen=True)
class VerifyReport:
    """A verification: what ran against what, how many tensors were compared, the one that came closest to
    its tolerance, and every divergence in the order the steps computed them."""

    subject: str  # the model, or the --step reference
    side: str
    against: str
    topology: str
    steps: int
    checked: int
    losses: tuple[StepLoss, ...]
    closest: TensorCheck | None
    divergences: tuple[Divergence, ...]
    rule: str
    schema: str = SCHEMA

    @property
    def same(self) -> bool:
        """Whether every tensor of every step agreed within its tolerance."""
        return not self.divergences

    @property
    def exit_code(self) -> int:
        """0: the same computation; 1: diverged."""
        return 0 if self.same else 1


def _plain(value: Any) -> Any:
    """JSON has no infinities or NaN: those floats are written as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key.rstrip("_"): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def report_to_json(report: VerifyReport) -> str:
    """The report as canonical JSON (sorted keys, two-space indent, newline-terminated), with `same`."""
    data = _plain(dataclasses.asdict(report))
    data["same"] = report.same
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"
