"""The plan: tensors, collectives, memory, compiled work, estimate and findings of one case."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardscope.hlo.profile import WorkBin
from shardscope.plan.estimate import Estimate
from shardscope.plan.findings import Finding
from shardscope.plan.frames import collectives_frame, tensors_frame
from shardscope.plan.records import PARTS, SCHEMA, CaseRecord, CollectiveRow, TensorRecord

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Plan:
    """Tensors, collectives and memory of one compiled train step."""

    case: CaseRecord
    provenance: tuple[tuple[str, Any], ...]
    tensors: tuple[tuple[str, TensorRecord], ...]  # sorted by path
    collectives: tuple[CollectiveRow, ...] = ()
    memory: tuple[tuple[str, int], ...] = ()
    schema: str = SCHEMA
    extra: tuple[tuple[str, Any], ...] = field(default=())  # unknown top-level keys, kept on round-trip
    parts: tuple[str, ...] = PARTS
    # Per-device work of the compiled step ("flops", "bytes_accessed"; see `shardscope.cost.work`); empty in
    # plans that were not compiled or were written before it was recorded.
    compute: tuple[tuple[str, int], ...] = ()
    # The compiled step's ops binned by kind, pass, executions and arithmetic intensity
    # (`shardscope.hlo.profile`): what the per-op cost model sums. Empty where `compute` is.
    work: tuple[WorkBin, ...] = ()
    # What the plan costs on a target TPU (`shardscope.cost.price_plan`): derived from the fields above and a
    # hardware table, so diffs re-price both sides rather than compare it.
    estimate: Estimate | None = None
    # Lint findings on this case (`shardscope lint`); written only when there are some, so that a plan
    # without findings reads and writes as before.
    findings: tuple[Finding, ...] = ()

    @property
    def tensor_map(self) -> dict[str, TensorRecord]:
        """Path → record."""
        return dict(self.tensors)

    def holds(self, part: str) -> bool:
        """Whether the plan holds `part` ("collectives" and "memory" need a compile)."""
        return part in self.parts

    def tensors_frame(self) -> pd.DataFrame:
        """Every tensor as a pandas DataFrame row (see `shardscope.plan.frames.tensors_frame`)."""
        return tensors_frame(self)

    def collectives_frame(self) -> pd.DataFrame:
        """Every collective row as a pandas DataFrame row (see `shardscope.plan.frames.collectives_frame`)."""
        return collectives_frame(self)
