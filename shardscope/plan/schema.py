"""The plan JSON's shape as types, and what pydantic makes of them: the reader's validation and the published
JSON Schema of `shardscope.plan/1` (`shardscope schema`, `shardscope/plan/plan.schema.json`).

The rows of a plan are their own records: a tensor is read straight into a `TensorRecord`, a collective into a
`CollectiveRow` (its cause a `Cause` of `RuleCause`s), a work bin into a `WorkBin`, a finding into a `Finding`,
an estimate's row time into a `RowTime`. Only the document around them, whose JSON differs from the
records on purpose (the tensors keyed by path, the mesh as a dict plus its axis order, the estimate's derived
figures written for readers), is spelled out here as TypedDicts. One adapter of those types validates a plan
(every error names its field) and converts it; the same adapter writes the JSON Schema, so the published
schema cannot drift from what the reader accepts (a test compares the shipped file with the records).

Why pydantic, and why the writer stays by hand: pydantic validates stdlib frozen dataclasses as they are
(no second set of record classes) and writes a draft 2020-12 JSON Schema; its Rust core reads a plan no
slower than the hand-written converters it replaced (`benchmarks/bench.py --only json`: the 93 stored plans
and goldens, 11 MB, against json.loads/json.dumps of the same text in the same run; load 1.9x json.loads
with pydantic, 2.2-2.3x with the converters; load + save 1.45x the floor either way). msgspec would need a
second set of records (Structs) and writes non-ASCII as UTF-8 where four stored plans hold `\u2026`-style
escapes; cattrs needs a hook per renamed field and writes no schema. The writer (`shardscope.plan.json`)
stays `json.dumps(sort_keys=True, indent=2)` over per-record dicts: the plan omits optional fields by rules
that no single dump switch spells (`exclude_defaults` would drop a cause's empty `rules`, which every stored
plan writes), and byte-identical output is the requirement.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal, NotRequired

from typing_extensions import TypedDict

from shardscope.errors import PlanError
from shardscope.hlo.profile import WorkBin
from shardscope.plan.estimate import RowTime
from shardscope.plan.findings import Finding
from shardscope.plan.records import SCHEMA, CollectiveRow, TensorRecord

if TYPE_CHECKING:
    from pydantic import TypeAdapter, ValidationError

# The JSON names of record fields whose Python names differ (`pass` is a keyword; a finding's lint is its `id`).
JSON_NAMES = {"pass_": "pass", "lint": "id"}
SCHEMA_FILE = "plan.schema.json"  # shipped beside this module (package data)
SCHEMA_URI = "https://json-schema.org/draft/2020-12/schema"


def json_name(field: str) -> str:
    """A record field's name in the plan JSON."""
    return JSON_NAMES.get(field, field)


# Every dict below keeps keys it does not know (a newer shardscope's additive field reads as before);
# the plan's own top level keeps them in `Plan.extra`.
_OPEN = {"alias_generator": json_name, "extra": "ignore"}
_TOP_LEVEL = {**_OPEN, "extra": "allow"}

JsonScalar = str | int | float | bool | None


class CaseDocument(TypedDict):
    """What was planned: model, preset, topology and mesh (`mesh_axes` keeps the axis order, which decides
    device placement; JSON keys are sorted)."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]

    model: str
    preset: str
    topology: str
    mesh: dict[str, int]
    mesh_axes: NotRequired[list[str]]
    axis_types: str
    overrides: NotRequired[dict[str, str]]
    preset_source: NotRequired[str]


_CrossSliceRow = TypedDict(
    "_CrossSliceRow",
    {
        "op": str,
        "axes": list[str] | None,
        "dtype": str,
        "bytes": int,
        "count": int,
        "loop_trips": int | None,
        "pass": str,
        "source": str,
        "time": RowTime,
    },
)


class CrossSliceRow(_CrossSliceRow):
    """Traffic between slices, which the plan's collectives do not hold, with its time."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]


class ComputeDocument(TypedDict):
    """Roofline time of a device's FLOPs and HBM traffic (`seconds` and `bound` derived, written for readers)."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]

    flops: int | float | None
    bytes_accessed: int | float | None
    flops_seconds: float
    memory_seconds: float
    seconds: NotRequired[float]
    bound: NotRequired[Literal["compute", "memory"]]
    per_op_seconds: NotRequired[float | None]


class StepDocument(TypedDict):
    """Step time: the two bounds (derived) and the single best figure."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]

    no_overlap: NotRequired[float]
    full_overlap: NotRequired[float]
    expected: NotRequired[float | None]
    expected_method: NotRequired[str | None]
    host_transfer: NotRequired[float]


class MemoryDocument(TypedDict):
    """HBM bytes per device by category (in `order`) against capacity; `exact` … `over` derived."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]

    categories: dict[str, int]
    order: list[str]
    capacity: int
    source: str
    exact: NotRequired[bool]
    total: NotRequired[int]
    fits: NotRequired[bool]
    over: NotRequired[int]


class EstimateTotals(TypedDict):
    """What a plan costs on one target TPU, without its per-row times (what a diff carries of each side)."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]

    hardware: str
    slice_shape: list[int]
    slices: int
    layout_source: str
    efficiency: float
    efficiency_source: str
    figures_source: str
    by_axes: dict[str, float]
    by_op: dict[str, float]
    by_pass: dict[str, float]
    communication: float
    unpriced_rows: int
    compute: ComputeDocument
    step: NotRequired[StepDocument]
    route: NotRequired[str]
    memory: MemoryDocument


class EstimateDocument(EstimateTotals):
    """What the plan costs on one target TPU; `rows` are aligned with the plan's `collectives`."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]

    rows: list[RowTime]
    cross_slice: list[CrossSliceRow]


class PlanDocument(TypedDict):
    """A shardscope plan (`shardscope.plan/1`): where every tensor of one compiled train step lives, the
    collectives the compiler emitted, its memory, its work, what it costs and what lints found. Fields not
    listed are kept as they are by readers; every listed field keeps its meaning within version 1."""

    __pydantic_config__ = _TOP_LEVEL  # type: ignore[misc]

    schema: str
    case: CaseDocument
    provenance: dict[str, Any]
    tensors: dict[str, TensorRecord]
    collectives: list[CollectiveRow]
    memory: dict[str, int]
    parts: NotRequired[list[Literal["tensors", "collectives", "memory"]]]
    compute: NotRequired[dict[str, int]]
    work: NotRequired[list[WorkBin]]
    estimate: NotRequired[EstimateDocument | None]
    findings: NotRequired[list[Finding]]


@functools.cache
def adapter(document: type) -> TypeAdapter[Any]:
    """The pydantic adapter of a document type (built once; pydantic loads on first use)."""
    from pydantic import TypeAdapter  # lazy: off the --help path

    return TypeAdapter(document)


def validation_message(err: ValidationError) -> str:
    """The first error as one line: where in the document, and what is wrong (`collectives.3.bytes: Input should
    be a valid integer, got 'x'`), with how many more there are."""
    first = err.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    found = first.get("input")
    shown = "" if isinstance(found, dict | list) else f", found {found!r}"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where}: {first['msg']}{shown}{more}"


def validate_document(document: type, data: Any, what: str) -> Any:
    """`data` read into `document`'s types (its records built), or a PlanError naming the first wrong field.

    Raises:
      PlanError: a missing, mistyped or out-of-range field (`what` opens the message).
    """
    from pydantic import ValidationError  # lazy: off the --help path

    try:
        return adapter(document).validate_python(data)
    except ValidationError as err:
        raise PlanError(f"{what} ({validation_message(err)})") from None


def generated_schema(document: type, title: str, version: str) -> dict[str, Any]:
    """The JSON Schema of a document type, as pydantic writes it from the records, with its title and
    `$schema` (draft 2020-12)."""
    schema = adapter(document).json_schema(by_alias=True, mode="validation")
    properties = schema.get("properties", {})
    if "schema" in properties:
        properties["schema"] = {"const": version, "description": "The format and its version.", "type": "string"}
    return {"$schema": SCHEMA_URI, "title": title, **{k: v for k, v in schema.items() if k != "title"}}


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema of `shardscope.plan/1`, generated from the plan's records."""
    return generated_schema(PlanDocument, SCHEMA, SCHEMA)


def schema_text(schema: dict[str, Any]) -> str:
    """A schema as its shipped file spells it: sorted keys, indent 2, trailing newline."""
    return json.dumps(schema, sort_keys=True, indent=2) + "\n"


def shipped_schema(package: str = "shardscope.plan", name: str = SCHEMA_FILE) -> str:
    """The text of a JSON Schema file shipped in the package (`shardscope/plan/plan.schema.json`, and the
    diff's `shardscope/diff/diff.schema.json`)."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")
