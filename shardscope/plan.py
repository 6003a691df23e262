"""The plan: a plain, versioned, deterministic record of one case (schema `shardscope.plan/1`).

No JAX objects live here. `plan_to_json` is canonical (sorted keys, indent 2, trailing newline), and
`plan_from_json(plan_to_json(p)) == p` exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardscope.errors import PlanError
from shardscope.lint.finding import Finding, finding_from_json, finding_to_json
from shardscope.rules import Spec, SpecEntry, shard_shape

if TYPE_CHECKING:
    from shardscope.cost.estimate import Estimate

SCHEMA = "shardscope.plan/1"
SCHEMA_FAMILY = "shardscope.plan/"
SCHEMA_VERSION = 1
TENSOR_KINDS = ("param", "opt_state", "input", "activation", "output")
PASSES = ("forward", "backward", "optimizer", "other")
# What a plan can hold. A plan made without compiling (`dump --tensors-only`) holds tensors only; the JSON
# lists its parts only when they are not all of them, so full plans read and write as before.
PARTS = ("tensors", "collectives", "memory")
TENSORS_ONLY = ("tensors",)


@dataclass(frozen=True)
class TensorRecord:
    """Where one tensor lives: its logical axes, physical spec and per-device footprint."""

    kind: str
    shape: tuple[int, ...]
    dtype: str
    logical: tuple[str | None, ...] | None
    spec: Spec
    shard_shape: tuple[int, ...]
    bytes_per_device: int


@dataclass(frozen=True)
class CollectiveRow:
    """One distinct collective of the compiled step; total traffic = bytes × count × loop_trips."""

    op: str
    axes: tuple[str, ...] | None  # None: the device groups match no set of mesh axes (see `groups`)
    dtype: str
    shape: tuple[int, ...]
    bytes: int  # per device per execution
    count: int
    loop_trips: int | None  # None: an enclosing loop's trip count is unknown
    pass_: str
    source: str
    groups: str | None = None
    shift: int | None = None

    @property
    def traffic(self) -> int | None:
        """bytes × count × loop_trips (None when a trip count is unknown)."""
        return None if self.loop_trips is None else self.bytes * self.count * self.loop_trips


@dataclass(frozen=True)
class CaseRecord:
    """What was planned: the case header of a plan."""

    model: str
    preset: str
    topology: str
    mesh: tuple[tuple[str, int], ...]
    axis_types: str
    overrides: tuple[tuple[str, str], ...] = ()


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

    def tensors_frame(self) -> Any:
        """Every tensor as a pandas DataFrame row (see `shardscope.tables.tensors_frame`)."""
        from shardscope.tables import tensors_frame

        return tensors_frame(self)

    def collectives_frame(self) -> Any:
        """Every collective row as a pandas DataFrame row (see `shardscope.tables.collectives_frame`)."""
        from shardscope.tables import collectives_frame

        return collectives_frame(self)


def tensor_record(
    kind: str, shape: Sequence[int], dtype: Any, logical: Sequence[str | None] | None, spec: Spec, mesh: dict[str, int]
) -> TensorRecord:
    """A tensor's record, with its per-device shard shape and bytes (ceil division: XLA pads uneven shards)."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 and the float8 types with numpy)
    import numpy as np

    local = shard_shape(shape, spec, mesh)
    return TensorRecord(
        kind=kind,
        shape=tuple(int(d) for d in shape),
        dtype=str(np.dtype(dtype)),
        logical=tuple(logical) if logical is not None else None,
        spec=spec,
        shard_shape=local,
        bytes_per_device=math.prod(local) * np.dtype(dtype).itemsize,
    )


def _spec_to_json(spec: Spec) -> list[Any]:
    return [list(entry) if isinstance(entry, tuple) else entry for entry in spec]


def _spec_from_json(raw: list[Any]) -> Spec:
    def entry(value: Any) -> SpecEntry:
        if isinstance(value, list):
            return tuple(value)
        return value

    return tuple(entry(v) for v in raw)


def _collective_to_json(row: CollectiveRow) -> dict[str, Any]:
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
    return data


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
            },
            "provenance": dict(plan.provenance),
            "tensors": {
                path: {
                    "kind": t.kind,
                    "shape": list(t.shape),
                    "dtype": t.dtype,
                    "logical": list(t.logical) if t.logical is not None else None,
                    "spec": _spec_to_json(t.spec),
                    "shard_shape": list(t.shard_shape),
                    "bytes_per_device": t.bytes_per_device,
                }
                for path, t in plan.tensors
            },
            "collectives": [_collective_to_json(row) for row in plan.collectives],
            "memory": dict(plan.memory),
        }
    )
    if plan.parts != PARTS:
        data["parts"] = list(plan.parts)
    if plan.compute:
        data["compute"] = dict(plan.compute)
    if plan.estimate is not None:
        from shardscope.cost.estimate_json import estimate_to_json

        data["estimate"] = estimate_to_json(plan.estimate)
    if plan.findings:
        data["findings"] = [finding_to_json(finding) for finding in plan.findings]
    return data


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
        )
        tensors = []
        for path, t in sorted(_require(data, "tensors", dict, source).items()):
            tensors.append(
                (
                    path,
                    TensorRecord(
                        kind=str(t["kind"]),
                        shape=tuple(int(d) for d in t["shape"]),
                        dtype=str(t["dtype"]),
                        logical=tuple(t["logical"]) if t.get("logical") is not None else None,
                        spec=_spec_from_json(t["spec"]),
                        shard_shape=tuple(int(d) for d in t["shard_shape"]),
                        bytes_per_device=int(t["bytes_per_device"]),
                    ),
                )
            )
        collectives = tuple(
            CollectiveRow(
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
            )
            for c in _require(data, "collectives", list, source)
        )
        memory = tuple(sorted((str(k), int(v)) for k, v in _require(data, "memory", dict, source).items()))
        provenance = tuple(sorted(_require(data, "provenance", dict, source).items()))
        parts = tuple(str(part) for part in data.get("parts", PARTS))
        compute = tuple(sorted((str(k), int(v)) for k, v in data.get("compute", {}).items()))
        findings = tuple(finding_from_json(entry) for entry in data.get("findings", []))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise PlanError(f"{source}: corrupt plan ({type(err).__name__}: {err})") from None
    unknown_parts = [part for part in parts if part not in PARTS]
    if unknown_parts or "tensors" not in parts:
        raise PlanError(f"{source}: corrupt plan (parts {list(parts)}, expected some of {list(PARTS)} with tensors)")
    estimate = None
    if data.get("estimate") is not None:
        from shardscope.cost.estimate_json import estimate_from_json

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


def load_plan(path: Path, what: str = "plan") -> Plan:
    """Reads a plan file.

    Raises:
      PlanError: missing, unreadable, corrupt, or written by a newer shardscope.
    """
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
