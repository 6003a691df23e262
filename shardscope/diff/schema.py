"""The diff JSON's shape as types (`shardscope diff --json`, a check report's diffs): its reader's validation
and its published JSON Schema (`shardscope schema diff`, `shardscope/diff/diff.schema.json`).

As the plan's (`shardscope.plan.schema`, which says why pydantic): a change's sides are the plan's own records
(a `TensorRecord`, a `Finding`), the diff's `CollectiveSide`, or a JSON value, by the change's kind; its
details are `DimChange`s and `FieldChange`s; a rule change is a `RuleChange`. Only the document around them is
spelled out here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import Field
from typing_extensions import TypedDict

from shardscope.diff.changes import CollectiveSide, DimChange, FieldChange, RuleChange
from shardscope.plan.findings import Finding
from shardscope.plan.records import TensorRecord
from shardscope.plan.schema import EstimateTotals, generated_schema, json_name

DIFF_SCHEMA = "shardscope.diff/1"
SCHEMA_FILE = "diff.schema.json"  # shipped beside this module (package data)

_OPEN = {"alias_generator": json_name, "extra": "ignore"}

Detail = DimChange | FieldChange


class _ChangeBase(TypedDict):
    __pydantic_config__ = _OPEN  # type: ignore[misc]

    subject: str
    details: list[Detail]


class TensorChangeDocument(_ChangeBase):
    """A tensor removed, added, changed (shape, dtype, kind or logical axes) or re-placed (its spec)."""

    kind: Literal["tensor_removed", "tensor_added", "tensor_changed", "spec_changed"]
    before: TensorRecord | None
    after: TensorRecord | None


class CollectiveChangeDocument(_ChangeBase):
    """The rows of one collective key removed, added, or moved in count, bytes or trips."""

    kind: Literal["collective_removed", "collective_added", "collective_changed"]
    before: CollectiveSide | None
    after: CollectiveSide | None


class FindingChangeDocument(_ChangeBase):
    """A lint finding resolved, added, or changed in its figures."""

    kind: Literal["finding_resolved", "finding_added", "finding_changed"]
    before: Finding | None
    after: Finding | None


class ValueChangeDocument(_ChangeBase):
    """A case field, an unknown top-level plan field, a memory or compute figure that moved."""

    kind: Literal["case", "extra_changed", "memory_changed", "compute_changed"]
    before: Any
    after: Any


ChangeDocument = Annotated[
    TensorChangeDocument | CollectiveChangeDocument | FindingChangeDocument | ValueChangeDocument,
    Field(discriminator="kind"),
]


class CaseHeader(TypedDict):
    """A side's case: the mesh as its command-line spelling, axes in device order (`fsdp=4,expert=2`)."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]

    model: str
    preset: str
    preset_source: NotRequired[str]
    topology: str
    mesh: str
    axis_types: str
    overrides: dict[str, str]


class TrafficDocument(TypedDict):
    """Bytes moved per device per step, in total and per mesh axes, op and pass."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]

    total: int
    by_axes: dict[str, int]
    by_op: dict[str, int]
    by_pass: dict[str, int]


class DiffDocument(TypedDict):
    """A semantic diff of two shardscope plans (`shardscope diff --json`): the verdict, every change with its
    details, the traffic of both sides, the rule changes that explain the collective changes, and both sides
    priced on one target (never part of the verdict)."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]

    same: bool
    cost_before: EstimateTotals | None
    cost_after: EstimateTotals | None
    old: CaseHeader
    new: CaseHeader
    notes: list[str]
    changes: list[ChangeDocument]
    traffic_before: TrafficDocument
    traffic_after: TrafficDocument
    unchanged_tensors: int
    unchanged_collectives: int
    unchanged_findings: int
    rule_changes: list[RuleChange]
    compilers_choices: list[str]


def diff_json_schema() -> dict[str, Any]:
    """The JSON Schema of the diff JSON, generated from the diff's records."""
    return generated_schema(DiffDocument, DIFF_SCHEMA, DIFF_SCHEMA)
