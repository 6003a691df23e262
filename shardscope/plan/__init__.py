"""The plan: the record every later stage reads (schema `shardscope.plan/1`; ARCHITECTURE.md, "The records").

- `records`: the rows (a tensor's placement, a collective row, the case header) and schema constants;
- `document`: the `Plan` itself; `findings` and `estimate`: the records of its extra sections;
- `json`, `estimate_json`: canonical JSON and back (one writer per record, reading through `schema`);
- `schema`: the plan JSON's types, which validate it and give the published JSON Schema (`plan.schema.json`);
- `frames`: pandas tables of a plan; `totals`: traffic per axis, op and pass, bytes per kind;
- `units`: bytes, seconds and FLOPs as every report spells them.
"""

from shardscope.plan.document import Plan
from shardscope.plan.findings import Finding
from shardscope.plan.json import check_schema, load_plan, plan_from_dict, plan_from_json, plan_to_dict, plan_to_json
from shardscope.plan.records import (
    PARTS,
    PASSES,
    SCHEMA,
    TENSOR_KINDS,
    TENSORS_ONLY,
    CaseRecord,
    Cause,
    CollectiveRow,
    RuleCause,
    TensorRecord,
    axes_label,
    case_record,
    tensor_record,
)

__all__ = [
    "PARTS",
    "PASSES",
    "SCHEMA",
    "TENSORS_ONLY",
    "TENSOR_KINDS",
    "CaseRecord",
    "Cause",
    "CollectiveRow",
    "Finding",
    "Plan",
    "RuleCause",
    "TensorRecord",
    "axes_label",
    "case_record",
    "check_schema",
    "load_plan",
    "plan_from_dict",
    "plan_from_json",
    "plan_to_dict",
    "plan_to_json",
    "tensor_record",
]
