"""`explain`: the physical spec of a logical-axes tuple under a preset, dimension by dimension.

Symbolic: no devices, no JAX. Mesh sizes only feed notes (an axis of size 1 shards nothing).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardscope.case.presets import Preset
from shardscope.case.rules import DimDecision, SpecEntry, explain_logical
from shardscope.errors import MeshError, ShardscopeError, unknown_name


@dataclass(frozen=True)
class Explanation:
    """The decisions for one logical-axes tuple, plus notes worth a reviewer's eye."""

    logical: tuple[str | None, ...]
    decisions: tuple[DimDecision, ...]
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """{"spec": [...], "dims": [...]} with spec entries normalised as in a plan."""

        def entry(value: SpecEntry) -> Any:
            return list(value) if isinstance(value, tuple) else value

        return {
            "spec": [entry(d.spec) for d in self.decisions],
            "dims": [
                {
                    "logical": d.logical,
                    "spec": entry(d.spec),
                    "rule": d.rule_index,
                    "skipped": [
                        {"rule": s.rule_index, "mesh_axes": list(s.mesh_axes), "reason": s.reason} for s in d.skipped
                    ],
                }
                for d in self.decisions
            ],
            "notes": list(self.notes),
        }


def parse_logical_axes(words: Sequence[str]) -> tuple[str | None, ...]:
    """Command-line words → logical axes; "None" (as in a PartitionSpec) is an unnamed dimension."""
    return tuple(None if word in ("None", "none", "null", "-") else word for word in words)


def explain_axes(preset: Preset, words: Sequence[str], mesh: Mapping[str, int]) -> Explanation:
    """Explains how `preset` resolves the logical axes `words`.

    Raises:
      ShardscopeError: no axes given, a name given twice, or --mesh names an axis the preset lacks.
    """
    if not words:
        raise ShardscopeError("explain needs logical axis names, e.g. `shardscope explain activation_batch None`")
    logical = parse_logical_axes(words)
    for axis in mesh:
        if axis not in preset.mesh_axes:
            raise MeshError(f"--mesh names a missing mesh axis: {unknown_name('axis', axis, preset.mesh_axes).args[0]}")
    try:
        decisions = explain_logical(logical, preset.logical_axis_rules)
    except ValueError as err:
        raise ShardscopeError(str(err)) from None
    sizes = {axis: 1 for axis in preset.mesh_axes} | dict(preset.mesh) | dict(mesh)
    return Explanation(logical, decisions, _notes(preset, logical, decisions, sizes))


def _notes(
    preset: Preset, logical: Sequence[str | None], decisions: Sequence[DimDecision], sizes: Mapping[str, int]
) -> tuple[str, ...]:
    notes = []
    named = sorted({name for name, _ in preset.logical_axis_rules})
    for dim, (name, decision) in enumerate(zip(logical, decisions, strict=True)):
        if name is not None and name not in named:
            close = difflib.get_close_matches(name, named, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            notes.append(f"dimension {dim}: no rule names {name!r}, so it is replicated{hint}")
        absent = [axis for axis in decision.mesh_axes if axis not in preset.mesh_axes]
        if absent:
            notes.append(
                f"dimension {dim}: mesh axis {', '.join(map(repr, absent))} is not in the preset's mesh_axes: "
                f"size 1, as MaxText treats it (shards nothing)"
            )
        idle = [axis for axis in decision.mesh_axes if axis in preset.mesh_axes and sizes.get(axis) == 1]
        if idle:
            notes.append(
                f"dimension {dim}: mesh axis {', '.join(map(repr, idle))} has size 1 on this mesh (shards nothing)"
            )
    return tuple(notes)
