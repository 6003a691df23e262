"""A plan as canonical JSON and back: one converter per record, `plan_from_json(plan_to_json(p)) == p` exactly.

`plan_to_json` is canonical (sorted keys, indent 2, trailing newline, no timestamps); reading validates the
shape of every field and refuses a newer schema, so a corrupt or future golden is one clear error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardscope.case.rules import Spec, SpecEntry
from shardscope.errors import PlanError
from shardscope.hlo.profile import WorkBin
from shardscope.plan.document import Plan
from shardscope.plan.estimate_json import estimate_from_json, estimate_to_json
from shardscope.plan.findings import SEVERITIES, Finding
from shardscope.plan.records import (
    PARTS,
    SCHEMA,
    SCHEMA_FAMILY,
    SCHEMA_VERSION,
    CaseRecord,
    Cause,
    CollectiveRow,
    RuleCause,
    TensorRecord,
)


def _spec_to_json(spec: Spec) -> list[Any]:
    return [list(entry) if isinstance(entry, tuple) else entry for entry in spec]


def _spec_from_json(raw: list[Any]) -> Spec:
    def entry(value: Any) -> SpecEntry:
        if isinstance(value, list):
            return tuple(value)
        return value

    return tuple(entry(v) for v in raw)


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


def tensor_from_json(t: Any) -> TensorRecord:
    """Reads one entry of a plan's `tensors` (KeyError/TypeError/ValueError when it is not one)."""
    return TensorRecord(
        kind=str(t["kind"]),
        shape=tuple(int(d) for d in t["shape"]),
        dtype=str(t["dtype"]),
        logical=tuple(t["logical"]) if t.get("logical") is not None else None,
        spec=_spec_from_json(t["spec"]),
        shard_shape=tuple(int(d) for d in t["shard_shape"]),
        bytes_per_device=int(t["bytes_per_device"]),
    )


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


def cause_from_json(c: Any) -> Cause:
    """Reads a collective's `cause` (KeyError/TypeError/ValueError when it is not one)."""
    return Cause(
        tensors=tuple(str(t) for t in c["tensors"]),
        consumer=str(c["consumer"]),
        line=None if c["line"] is None else str(c["line"]),
        rules=tuple(
            RuleCause(str(r["logical"]), tuple(str(a) for a in r["axes"]), int(r["rule"]), str(r["tensor"]))
            for r in c["rules"]
        ),
    )


def collective_from_json(c: Any) -> CollectiveRow:
    """Reads one entry of a plan's `collectives` (KeyError/TypeError/ValueError when it is not one)."""
    return CollectiveRow(
        op=str(c["op"]),
        axes=tuple(c["axes"]) if c["axes"] is not None else None,
        dtype=str(c["dtype"]),
        shape=tuple(int(d) for d in c["shape"]),
        bytes=int(c["bytes"]),
        count=int(c["count"]),
        loop_trips=None if c["loop_trips"] is None else int(c["loop_trips"]),
        pass_=str(c["pass"]),
        source=str(c["source"]),
        groups=c.get("groups"),
        shift=c.get("shift"),
        tpu_bytes=None if c.get("tpu_bytes") is None else int(c["tpu_bytes"]),
        handoff=bool(c.get("handoff", False)),
        tpu_moved_out=None if c.get("tpu_moved_out") is None else int(c["tpu_moved_out"]),
        cause=None if c.get("cause") is None else cause_from_json(c["cause"]),
    )


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
    """One bin of the compiled step's work profile."""
    return {
        "kind": entry.kind,
        "pass": entry.pass_,
        "executions": entry.executions,
        "intensity": entry.intensity,
        "ops": entry.ops,
        "flops": entry.flops,
        "bytes": entry.bytes,
        "region": entry.region,
    }


def work_from_json(data: dict[str, Any]) -> WorkBin:
    """Inverse of `work_to_json` (raises KeyError/TypeError/ValueError on a malformed entry)."""
    intensity = data["intensity"]
    return WorkBin(
        kind=str(data["kind"]),
        pass_=str(data["pass"]),
        executions=int(data["executions"]),
        intensity=None if intensity is None else int(intensity),
        ops=int(data["ops"]),
        flops=int(data["flops"]),
        bytes=int(data["bytes"]),
        region=int(data.get("region", 0)),
    )


def plan_to_json(plan: Plan) -> str:
    """Canonical JSON text: sorted keys, indent 2, trailing newline."""
    return json.dumps(plan_to_dict(plan), sort_keys=True, indent=2) + "\n"


def _require(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise PlanError(f"{where}: missing key {key!r}")
    if not isinstance(data[key], kind):
        raise PlanError(f"{where}: {key!r} must be a {kind.__name__}, found {type(data[key]).__name__}")
    return data[key]


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
    """Reads plan data, validating its shape.

    Raises:
      PlanError: not a plan, a newer schema, or a missing/mistyped field.
    """
    check_schema(data, source)
    try:
        raw_case = _require(data, "case", dict, source)
        case = CaseRecord(
            model=str(raw_case["model"]),
            preset=str(raw_case["preset"]),
            topology=str(raw_case["topology"]),
            mesh=tuple(
                (str(axis), int(raw_case["mesh"][axis])) for axis in raw_case.get("mesh_axes", raw_case["mesh"])
            ),
            axis_types=str(raw_case["axis_types"]),
            overrides=tuple(sorted((str(k), str(v)) for k, v in raw_case.get("overrides", {}).items())),
            preset_source=str(raw_case.get("preset_source", "")),
        )
        tensors = [(path, tensor_from_json(t)) for path, t in sorted(_require(data, "tensors", dict, source).items())]
        collectives = tuple(collective_from_json(c) for c in _require(data, "collectives", list, source))
        memory = tuple(sorted((str(k), int(v)) for k, v in _require(data, "memory", dict, source).items()))
        provenance = tuple(sorted(_require(data, "provenance", dict, source).items()))
        parts = tuple(str(part) for part in data.get("parts", PARTS))
        compute = tuple(sorted((str(k), int(v)) for k, v in data.get("compute", {}).items()))
        findings = tuple(finding_from_json(entry) for entry in data.get("findings", []))
        work = tuple(work_from_json(entry) for entry in data.get("work", []))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise PlanError(f"{source}: corrupt plan ({type(err).__name__}: {err})") from None
    unknown_parts = [part for part in parts if part not in PARTS]
    if unknown_parts or "tensors" not in parts:
        raise PlanError(f"{source}: corrupt plan (parts {list(parts)}, expected some of {list(PARTS)} with tensors)")
    estimate = None
    if data.get("estimate") is not None:
        estimate = estimate_from_json(data["estimate"], f"{source}: estimate")
        if len(estimate.rows) != len(collectives):
            raise PlanError(
                f"{source}: corrupt plan (estimate prices {len(estimate.rows)} collective rows, "
                f"the plan has {len(collectives)})"
            )
    known = {
        "schema",
        "case",
        "provenance",
        "tensors",
        "collectives",
        "memory",
        "parts",
        "compute",
        "work",
        "estimate",
        "findings",
    }
    extra = tuple(sorted((k, v) for k, v in data.items() if k not in known))
    return Plan(
        case=case,
        provenance=provenance,
        tensors=tuple(tensors),
        collectives=collectives,
        memory=memory,
        schema=str(data["schema"]),
        extra=extra,
        parts=tuple(part for part in PARTS if part in parts),
        compute=compute,
        work=work,
        estimate=estimate,
        findings=findings,
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


def finding_from_json(data: Any) -> Finding:
    """Reads one entry of a plan's `findings` list.

    Raises:
      KeyError, TypeError, ValueError: not a finding (plan reading turns these into a PlanError).
    """
    if not isinstance(data, dict):
        raise TypeError(f"a finding must be an object, found {type(data).__name__}")
    severity = str(data["severity"])
    if severity not in SEVERITIES:
        raise ValueError(f"finding severity {severity!r} is not one of {', '.join(SEVERITIES)}")
    return Finding(
        lint=str(data["id"]),
        severity=severity,
        subject=str(data["subject"]),
        message=str(data["message"]),
        fix=str(data["fix"]),
    )
