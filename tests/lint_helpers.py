"""Hand-made plans and presets for lint tests: each lint is checked on the smallest case that shows it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardscope.case.presets import Preset, preset_from_mapping
from shardscope.case.rules import drop_unit_axes, resolve_logical
from shardscope.lint.context import LintContext
from shardscope.lint.registry import CHECKS
from shardscope.plan import PARTS, TENSORS_ONLY, CaseRecord, CollectiveRow, Plan, TensorRecord, tensor_record
from shardscope.plan.findings import Finding

Mesh = Sequence[tuple[str, int]]


def preset(rules: Sequence[Sequence[Any]], mesh_axes: Sequence[str] = ("fsdp", "expert"), **extra: Any) -> Preset:
    """A preset from rules written as in YAML ([name, axes])."""
    return preset_from_mapping(
        {"mesh_axes": list(mesh_axes), "logical_axis_rules": [list(rule) for rule in rules], **extra}, "t", "test"
    )


def placed(
    kind: str, shape: Sequence[int], logical: Sequence[str | None], rules: Preset, mesh: Mesh, dtype: str = "float32"
) -> TensorRecord:
    """A tensor placed where `rules` put it on `mesh` (size-1 axes dropped, as plans do)."""
    sizes = dict(mesh)
    spec = drop_unit_axes(resolve_logical(logical, rules.logical_axis_rules), sizes)
    return tensor_record(kind, shape, dtype, logical, spec, sizes)


def plan(
    tensors: Mapping[str, TensorRecord],
    mesh: Mesh = (("fsdp", 4), ("expert", 2)),
    collectives: Sequence[CollectiveRow] = (),
    memory: Sequence[tuple[str, int]] = (),
    compiled: bool = True,
    backend: str = "cpu",
    topology: str = "cpu-8",
) -> Plan:
    """A plan holding these tensors (and collectives and memory when `compiled`)."""
    return Plan(
        case=CaseRecord(model="m", preset="t", topology=topology, mesh=tuple(mesh), axis_types="auto"),
        provenance=(("backend", backend),),
        tensors=tuple(sorted(tensors.items())),
        collectives=tuple(collectives),
        memory=tuple(memory),
        parts=PARTS if compiled else TENSORS_ONLY,
    )


def row(
    op: str, axes: Sequence[str], shape: Sequence[int], trips: int | None, source: str = "decoder"
) -> CollectiveRow:
    """A float32 collective row, once per iteration of `trips`."""
    size = 4
    for dim in shape:
        size *= dim
    return CollectiveRow(op, tuple(axes), "float32", tuple(shape), size, 1, trips, "forward", source)


def run(lint: str, ctx: LintContext) -> list[Finding]:
    """One lint's findings on a context."""
    return list(CHECKS[lint](ctx))
