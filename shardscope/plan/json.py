"""A plan as canonical JSON and back, `plan_from_json(plan_to_json(p)) == p` exactly.

`plan_to_json` is canonical (sorted keys, indent 2, trailing newline, no timestamps): one writer per record,
kept by hand so that every stored plan writes byte for byte as before (`shardscope.plan.schema` says why).
Reading refuses a newer schema, then validates and converts the whole document with the plan's types
(`shardscope.plan.schema`): a corrupt or future golden is one clear error naming its field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardscope.case.rules import Spec
from shardscope.errors import PlanError
from shardscope.hlo.profile import WorkBin
from shardscope.plan.document import Plan
from shardscope.plan.estimate_json import estimate_from_document, estimate_to_json
from shardscope.plan.findings import Finding
from shardscope.plan.records import (
    PARTS,
    SCHEMA,
    SCHEMA_FAMILY,
    SCHEMA_VERSION,
    CaseRecord,
    Cause,
    CollectiveRow,
    TensorRecord,
)
from shardscope.plan.schema import PlanDocument, validate_document


def _spec_to_json(spec: Spec) -> list[Any]:
    return [list(entry) if isinstance(entry, tuple) else entry for entry in spec]


def tensor_to_json(tensor: TensorRecord) -> dict[str, Any]:
    """A tensor record as the plan JSON spells it."""
    return {
        "kind": tensor.kind,
        "shape": list(tensor.shape),
        "dtype": tensor.dtype,
        "logical": list(tensor.logical) if tensor.logical is not None else None,
        "spec": _spec_to_json(tensor.spec),
        "shard_shape": list(tensor.shard_shape),
        "bytes_per_device": tensor.bytes_per_device,
    }


def collective_to_json(row: CollectiveRow) -> dict[str, Any]:
    """A collective row as the plan JSON spells it (`groups` and `shift` only when set)."""
    data: dict[str, Any] = {
        "op": row.op,
        "axes": list(row.axes) if row.axes is not None else None,
        "dtype": row.dtype,
        "shape": list(row.shape),
        "bytes": row.bytes,
        "count": row.count,
        "loop_trips": row.loop_trips,
        "pass": row.pass_,
        "source": row.source,
    }
    if row.groups is not None:
        data["groups"] = row.groups
    if row.shift is not None:
        data["shift"] = row.shift
    if row.tpu_bytes is not None:
        data["tpu_bytes"] = row.tpu_bytes
    if row.handoff:
        data["handoff"] = True
    if row.tpu_moved_out is not None:
        data["tpu_moved_out"] = row.tpu_moved_out
    if row.cause is not None:
        data["cause"] = cause_to_json(row.cause)
    if row.link is not None:
        data["link"] = row.link
    return data


def cause_to_json(cause: Cause) -> dict[str, Any]:
    """A collective's cause as the plan JSON spells it."""
    return {
        "tensors": list(cause.tensors),
        "consumer": cause.consumer,
        "line": cause.line,
        "rules": [
            {"logical": r.logical, "axes": list(r.axes), "rule": r.rule, "tensor": r.tensor} for r in cause.rules
        ],
    }


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plain JSON-able data."""
    case = plan.case
    data: dict[str, Any] = dict(plan.extra)
    data.update(
        {
            "schema": plan.schema,
            "case": {
                "model": case.model,
                "preset": case.preset,
                "topology": case.topology,
                "mesh": dict(case.mesh),
                # JSON keys are sorted, so the axis order (which decides device placement) is kept here.
                "mesh_axes": [axis for axis, _ in case.mesh],
                "axis_types": case.axis_types,
                "overrides": dict(case.overrides),
                **({"preset_source": case.preset_source} if case.preset_source else {}),
            },
            "provenance": dict(plan.provenance),
            "tensors": {path: tensor_to_json(t) for path, t in plan.tensors},
            "collectives": [collective_to_json(row) for row in plan.collectives],
            "memory": dict(plan.memory),
        }
    )
    if plan.parts != PARTS:
        data["parts"] = list(plan.parts)
    if plan.compute:
        data["compute"] = dict(plan.compute)
    if plan.work:
        data["work"] = [work_to_json(entry) for entry in plan.work]
    if plan.estimate is not None:
        data["estimate"] = estimate_to_json(plan.estimate)
    if plan.findings:
        data["findings"] = [finding_to_json(finding) for finding in plan.findings]
    return data


def work_to_json(entry: WorkBin) -> dict[str, Any]:
    """One bin of the compiled step's work profile (`precision` only where the matmuls are 8-bit)."""
    data: dict[str, Any] = {
        "kind": entry.kind,
        "pass": entry.pass_,
        "executions": entry.executions,
        "intensity": entry.intensity,
        "ops": entry.ops,
        "flops": entry.flops,
        "bytes": entry.bytes,
        "region": entry.region,
    }
    if entry.precision:
        data["precision"] = entry.precision
    return data


def plan_to_json(plan: Plan) -> str:
    """Canonical JSON text: sorted keys, indent 2, trailing newline."""
    return json.dumps(plan_to_dict(plan), sort_keys=True, indent=2) + "\n"


def check_schema(data: Any, source: str) -> None:
    """Rejects anything that is not a plan this version can read (newer schemas included)."""
    if not isinstance(data, dict):
        raise PlanError(f"{source}: not a shardscope plan (expected a JSON object)")
    schema = data.get("schema")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_FAMILY):
        raise PlanError(f"{source}: not a shardscope plan (schema {schema!r}, expected {SCHEMA!r})")
    version = schema.removeprefix(SCHEMA_FAMILY)
    if not version.isdigit():
        raise PlanError(f"{source}: unreadable schema {schema!r}")
    if int(version) > SCHEMA_VERSION:
        raise PlanError(
            f"{source}: schema {schema!r} is newer than this shardscope reads ({SCHEMA!r}); upgrade shardscope"
        )


def plan_from_dict(data: Any, source: str = "plan") -> Plan:
    """Reads plan data, validating it against the plan's types (`shardscope.plan.schema`).

    Raises:
      PlanError: not a plan, a newer schema, or a missing/mistyped field (named in the message).
    """
    check_schema(data, source)
    doc = validate_document(PlanDocument, data, f"{source}: corrupt plan")
    raw_case = doc["case"]
    mesh = raw_case["mesh"]
    axes = raw_case.get("mesh_axes", list(mesh))
    missing = [axis for axis in axes if axis not in mesh]
    if missing:
        raise PlanError(f"{source}: corrupt plan (case.mesh_axes names {missing}, which case.mesh lacks)")
    case = CaseRecord(
        model=raw_case["model"],
        preset=raw_case["preset"],
        topology=raw_case["topology"],
        mesh=tuple((axis, mesh[axis]) for axis in axes),
        axis_types=raw_case["axis_types"],
        overrides=tuple(sorted(raw_case.get("overrides", {}).items())),
        preset_source=raw_case.get("preset_source", ""),
    )
    parts = tuple(doc.get("parts", PARTS))
    if "tensors" not in parts:
        raise PlanError(f"{source}: corrupt plan (parts {list(parts)}, expected some of {list(PARTS)} with tensors)")
    collectives = tuple(doc["collectives"])
    estimate = None
    if doc.get("estimate") is not None:
        estimate = estimate_from_document(doc["estimate"])
        if len(estimate.rows) != len(collectives):
            raise PlanError(
                f"{source}: corrupt plan (estimate prices {len(estimate.rows)} collective rows, "
                f"the plan has {len(collectives)})"
            )
    known = PlanDocument.__annotations__.keys()
    return Plan(
        case=case,
        provenance=tuple(sorted(doc["provenance"].items())),
        tensors=tuple(sorted(doc["tensors"].items())),
        collectives=collectives,
        memory=tuple(sorted(doc["memory"].items())),
        schema=doc["schema"],
        extra=tuple(sorted((k, v) for k, v in data.items() if k not in known)),
        parts=tuple(part for part in PARTS if part in parts),
        compute=tuple(sorted(doc.get("compute", {}).items())),
        work=tuple(doc.get("work", ())),
        estimate=estimate,
        findings=tuple(doc.get("findings", ())),
    )


def plan_from_json(text: str, source: str = "plan") -> Plan:
    """Parses plan JSON text.

    Raises:
      PlanError: invalid JSON or not a readable plan.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PlanError(f"{source}: corrupt plan (invalid JSON at line {err.lineno}: {err.msg})") from None
    return plan_from_dict(data, source)


def load_plan(path: Path | str, what: str = "plan") -> Plan:
    """Reads a plan file.

    Raises:
      PlanError: missing, unreadable, corrupt, or written by a newer shardscope.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlanError(f"{what} file {path} does not exist") from None
    except IsADirectoryError:
        raise PlanError(f"{what} file {path} is a directory") from None
    except OSError as err:
        raise PlanError(f"cannot read {what} file {path} ({err.strerror})") from None
    except UnicodeDecodeError:
        raise PlanError(f"{path}: not a shardscope plan (not UTF-8 text)") from None
    return plan_from_json(text, str(path))


def finding_to_json(finding: Finding) -> dict[str, str]:
    """A finding as the plan JSON spells it."""
    return {
        "id": finding.lint,
        "severity": finding.severity,
        "subject": finding.subject,
        "message": finding.message,
        "fix": finding.fix,
    }
