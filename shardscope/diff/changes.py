"""The records of a diff: each change (its kind an Enum), its per-dimension and per-field details, and the
whole `PlanDiff` a report needs. A change's sides are the plan's own records (a `TensorRecord`, a
`Finding`), a `CollectiveSide` (the rows of one collective key, aggregated), or a plain JSON value (a memory
figure, a case field)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from shardscope.case.rules import SpecEntry
from shardscope.diff.frames import collective_changes_frame, tensor_changes_frame
from shardscope.diff.kinds import FINDING_CHANGE_KINDS, ChangeKind
from shardscope.plan.estimate import Estimate
from shardscope.plan.findings import Finding
from shardscope.plan.records import CaseRecord, Cause, CollectiveRow, TensorRecord
from shardscope.plan.totals import TrafficTotals

if TYPE_CHECKING:
    import pandas as pd

# `temp_bytes` is the scratch space XLA's buffer assignment chose; it depends on fusion and scheduling
# heuristics that may read the host (CPU features, thread count), so it can differ slightly between two
# machines of one kind even though it repeats exactly on one machine. 2% absorbs such noise while a real
# change still stands out (default → ep-as-cp moves it by 7% for deepseek-tiny). A TPU compile's peak
# (`peak_bytes`) holds the temporaries alive at it, and follows the same heuristics.
DEFAULT_TEMP_TOLERANCE = 0.02
TOLERANT_MEMORY_FIELDS = ("temp_bytes", "peak_bytes")

# Compiled work figures that follow fusion decisions, compared with the temp_bytes tolerance.
TOLERANT_COMPUTE_FIELDS = ("bytes_accessed",)

_R = TypeVar("_R")

# The identity of a collective row: (op, axes, groups, dtype, shape, pass, source, shift).
CollectiveKey = tuple[str, tuple[str, ...] | None, str | None, str, tuple[int, ...], str, str, int | None]


@dataclass(frozen=True)
class DimChange:
    """One tensor dimension whose spec entry changed."""

    dim: int
    logical: str | None
    before: SpecEntry
    after: SpecEntry
    axes_added: tuple[str, ...]
    axes_dropped: tuple[str, ...]  # both empty: the same axes in another order (another device layout)


# A value as JSON holds it: a memory or compute figure, a case field, an unknown top-level plan field. The
# type checker sees the recursive type; at run time (and in the diff's JSON Schema) it is any JSON value.
if TYPE_CHECKING:
    JsonValue: TypeAlias = str | int | float | bool | list["JsonValue"] | dict[str, "JsonValue"] | None
else:
    JsonValue = Any
# A collective's count, bytes or trips: one value, or the distinct values of the rows of its key.
Stat: TypeAlias = int | tuple[int | None, ...] | None


@dataclass(frozen=True)
class CollectiveSide:
    """The rows of one collective key on one side of a diff, aggregated: the key's fields, then how many
    instructions run (`count`), at which `bytes` and `loop_trips` (one value, or the distinct values of the
    rows, ascending), their `traffic` (None when a trip count is unknown) and their merged cause."""

    op: str
    axes: tuple[str, ...] | None
    axes_label: str  # as reports name the axes (`axes_label` of the first row)
    groups: str | None
    dtype: str
    shape: tuple[int, ...]
    pass_: str
    source: str
    shift: int | None
    count: int
    bytes: Stat
    loop_trips: Stat
    traffic: int | None
    cause: Cause | None


@dataclass(frozen=True)
class FieldChange:
    """A field that moved: a tensor's shape or bytes per device, a collective's count, a finding's message."""

    field: str
    before: JsonValue | Stat
    after: JsonValue | Stat


Detail = DimChange | FieldChange
# One side of a change (None where the subject is absent).
Side: TypeAlias = TensorRecord | CollectiveSide | Finding | JsonValue


@dataclass(frozen=True)
class Change:
    """One semantic difference between two plans.

    `before`/`after` (None on the side where the subject is absent) are, by kind: a `TensorRecord` (tensor
    kinds), a `CollectiveSide` (collective kinds), a `Finding` (finding kinds), or a JSON value (a case,
    memory, compute or extra field's). `tensor_sides`, `collective_sides` and `finding_sides` give them
    typed.
    """

    kind: ChangeKind
    subject: str
    before: Side
    after: Side
    details: tuple[Detail, ...] = ()

    def _sides(self, record: type[_R]) -> tuple[_R | None, _R | None]:
        sides = (self.before, self.after)
        if not all(side is None or isinstance(side, record) for side in sides):
            raise TypeError(f"a {self.kind} change has no {record.__name__} sides")
        return sides  # type: ignore[return-value]

    @property
    def tensor_sides(self) -> tuple[TensorRecord | None, TensorRecord | None]:
        """Before and after of a tensor change."""
        return self._sides(TensorRecord)

    @property
    def collective_sides(self) -> tuple[CollectiveSide | None, CollectiveSide | None]:
        """Before and after of a collective change."""
        return self._sides(CollectiveSide)

    @property
    def finding_sides(self) -> tuple[Finding | None, Finding | None]:
        """Before and after of a finding change."""
        return self._sides(Finding)

    @property
    def tensor(self) -> TensorRecord:
        """The tensor a tensor change is about: its new side unless it was removed."""
        before, after = self.tensor_sides
        return _present(after or before)

    @property
    def collective(self) -> CollectiveSide:
        """The collective a collective change is about: its new side unless it was removed."""
        before, after = self.collective_sides
        return _present(after or before)

    @property
    def finding(self) -> Finding:
        """The finding a finding change is about: its new side unless it was resolved."""
        before, after = self.finding_sides
        return _present(after or before)

    @property
    def dims(self) -> tuple[DimChange, ...]:
        """The per-dimension spec changes among the details."""
        return tuple(d for d in self.details if isinstance(d, DimChange))

    @property
    def fields(self) -> tuple[FieldChange, ...]:
        """The field changes among the details."""
        return tuple(d for d in self.details if isinstance(d, FieldChange))


def _present(side: _R | None) -> _R:
    if side is None:
        raise TypeError("a change with neither side")
    return side


MESH = "mesh"  # the `logical` of the group of collective changes the mesh's resizing explains


@dataclass(frozen=True)
class RuleChange:
    """A change of where one logical axis is placed, and the collective changes it explains.

    Attributes:
      logical: the logical axis name (MESH for changes explained only by the mesh changing).
      before, after: the mesh axes that dimension was on in the old and the new plan (() = replicated).
      tensors: the tensors of the collectives' causes whose dimension moved.
      collectives: the subjects of the collective changes it explains, in diff order.
      traffic_delta: bytes per device per step those changes add (negative: remove).
    """

    logical: str
    before: tuple[str, ...]
    after: tuple[str, ...]
    tensors: tuple[str, ...]
    collectives: tuple[str, ...]
    traffic_delta: int

    @property
    def move(self) -> str:
        """ "fsdp → replicated": where the dimension was and where it is ("" for the mesh's group)."""
        if self.logical == MESH:
            return ""

        def side(axes: tuple[str, ...]) -> str:
            return "+".join(axes) if axes else "replicated"

        return f"{side(self.before)} → {side(self.after)}"

    @property
    def title(self) -> str:
        """`embed_moe`: fsdp → replicated."""
        return "the mesh changed" if self.logical == MESH else f"`{self.logical}`: {self.move}"


@dataclass(frozen=True)
class PlanDiff:
    """Everything a report needs: the changes, and the totals of both sides for the headline."""

    old_case: CaseRecord
    new_case: CaseRecord
    changes: tuple[Change, ...]
    totals_before: TrafficTotals
    totals_after: TrafficTotals
    memory_before: tuple[tuple[str, int], ...]
    memory_after: tuple[tuple[str, int], ...]
    kinds_before: tuple[tuple[str, int, int], ...]  # (tensor kind, count, bytes per device)
    kinds_after: tuple[tuple[str, int, int], ...]
    unchanged_tensors: tuple[tuple[str, TensorRecord], ...]
    unchanged_collectives: tuple[CollectiveRow, ...]
    temp_tolerance: float
    notes: tuple[str, ...] = field(default=())  # e.g. a temp_bytes move within tolerance
    # Shown to explain a diff (a new JAX version), never compared.
    provenance_before: tuple[tuple[str, Any], ...] = field(default=())
    provenance_after: tuple[tuple[str, Any], ...] = field(default=())
    unchanged_findings: tuple[Finding, ...] = field(default=())  # lint findings both plans hold
    # Both plans priced on one target (`shardscope.cost.price`), or None when neither has one; shown, and
    # never part of the verdict: an estimate is derived from what is compared above.
    cost_before: Estimate | None = None
    cost_after: Estimate | None = None
    # The collective changes linked to the rule changes that caused them (`shardscope.diff.causes`), and
    # the subjects of those no rule change explains (the compiler's choices); shown, never compared.
    rule_changes: tuple[RuleChange, ...] = field(default=())
    compilers_choices: tuple[str, ...] = field(default=())
    # What each side holds, for its header: "compiled", "tensors only" (nothing compiled), ...
    old_holds: str = ""
    new_holds: str = ""
    # Traffic per network (`shardscope.diff.networks`), paired by name; empty unless a side is a GPU plan.
    networks_before: tuple[tuple[str, int], ...] = field(default=())
    networks_after: tuple[tuple[str, int], ...] = field(default=())

    @property
    def same(self) -> bool:
        """No difference outside provenance (and outside the stated temp_bytes tolerance)."""
        return not self.changes

    @property
    def placement_changes(self) -> tuple[Change, ...]:
        """The changes of what the plans place and move (tensors, collectives, memory, compute, extra plan
        fields): not the case header that names them, nor lint findings about them."""
        return tuple(c for c in self.changes if c.kind != ChangeKind.CASE and c.kind not in FINDING_CHANGE_KINDS)

    @property
    def traffic_compared(self) -> bool:
        """Both plans hold a compiled step: a tensors-only side's traffic is unknown, not zero."""
        return not any(holds.startswith(("tensors only", "MaxText")) for holds in (self.old_holds, self.new_holds))

    @property
    def finding_changes(self) -> tuple[Change, ...]:
        """The lint findings added, resolved or changed."""
        return tuple(c for c in self.changes if c.kind in FINDING_CHANGE_KINDS)

    def of_kind(self, *kinds: str) -> tuple[Change, ...]:
        """The changes of the given kinds, in diff order."""
        return tuple(c for c in self.changes if c.kind in kinds)

    def tensor_changes_frame(self) -> pd.DataFrame:
        """The tensor changes as a pandas DataFrame (see `shardscope.diff.frames.tensor_changes_frame`)."""
        return tensor_changes_frame(self)

    def collective_changes_frame(self) -> pd.DataFrame:
        """The collective changes as a pandas DataFrame (see `shardscope.diff.frames.collective_changes_frame`)."""
        return collective_changes_frame(self)
