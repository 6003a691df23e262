"""Plans compared by meaning: `diff_plans(old, new)` → a `PlanDiff` of typed changes.

- `kinds`: the kinds of change (an Enum), in report order; `changes`: the records (`Change`, its details,
  `PlanDiff`);
- `plans`: the diff itself; `pricing`: both sides priced on one target; `grouping`: what reports fold;
- `json`: a diff as JSON data and back; `schema`: its types and published JSON Schema (`diff.schema.json`);
- `frames`: pandas tables of a diff;
- `compare`: several plans side by side (`shardscope compare`).
"""

from shardscope.diff.changes import DEFAULT_TEMP_TOLERANCE, Change, DimChange, FieldChange, PlanDiff
from shardscope.diff.grouping import TensorGroup, group_tensor_changes, unit_axes
from shardscope.diff.json import case_dict, changes_from_json, diff_to_json
from shardscope.diff.kinds import (
    CHANGE_KINDS,
    COLLECTIVE_CHANGE_KINDS,
    FINDING_CHANGE_KINDS,
    TENSOR_CHANGE_KINDS,
    ChangeKind,
)
from shardscope.diff.plans import diff_plans, within_tolerance
from shardscope.diff.pricing import price_pair

__all__ = [
    "CHANGE_KINDS",
    "COLLECTIVE_CHANGE_KINDS",
    "DEFAULT_TEMP_TOLERANCE",
    "FINDING_CHANGE_KINDS",
    "TENSOR_CHANGE_KINDS",
    "Change",
    "ChangeKind",
    "DimChange",
    "FieldChange",
    "PlanDiff",
    "TensorGroup",
    "case_dict",
    "changes_from_json",
    "diff_plans",
    "diff_to_json",
    "group_tensor_changes",
    "price_pair",
    "unit_axes",
    "within_tolerance",
]
