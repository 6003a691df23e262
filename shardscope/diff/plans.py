"""Plan × Plan → changes: a diff by meaning (which dimension gained which mesh axis), not by text.

DeepDiff stays inside this module: it compares the flat case header, the memory dicts and any extra
top-level plan fields; tensors and collectives are aligned by hand because their identity (a path, a
collective key) is domain knowledge. A change carries the plan's own records (see `Change`).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from deepdiff import DeepDiff

from shardscope.case.lints import COMPILE, LINTS
from shardscope.case.rules import entry_axes
from shardscope.case.topology import format_mesh, mesh_label
from shardscope.diff.causes import explain_collective_changes, merged_cause
from shardscope.diff.changes import (
    DEFAULT_TEMP_TOLERANCE,
    TOLERANT_COMPUTE_FIELDS,
    TOLERANT_MEMORY_FIELDS,
    Change,
    ChangeKind,
    CollectiveKey,
    CollectiveSide,
    Detail,
    DimChange,
    FieldChange,
    PlanDiff,
)
from shardscope.diff.json import case_dict, jsonable
from shardscope.diff.networks import paired_networks
from shardscope.diff.pricing import price_pair
from shardscope.plan.document import Plan
from shardscope.plan.findings import Finding, sort_findings
from shardscope.plan.records import PASSES, CaseRecord, CollectiveRow, TensorRecord, axes_label
from shardscope.plan.totals import bytes_by_kind, traffic_totals


def dim_changes(old: TensorRecord, new: TensorRecord) -> tuple[DimChange, ...]:
    """Per dimension of equal-rank specs: which entries changed, which axes were added and dropped."""
    changes = []
    for dim, (before, after) in enumerate(zip(old.spec, new.spec, strict=True)):
        if before == after:
            continue
        was, now = entry_axes(before), entry_axes(after)
        logical = new.logical or old.logical
        changes.append(
            DimChange(
                dim=dim,
                logical=logical[dim] if logical is not None and dim < len(logical) else None,
                before=before,
                after=after,
                axes_added=tuple(a for a in now if a not in was),
                axes_dropped=tuple(a for a in was if a not in now),
            )
        )
    return tuple(changes)


def _tensor_change(path: str, old: TensorRecord, new: TensorRecord) -> Change:
    # Identity fields first: if any moved, the tensor itself changed and the spec change is secondary.
    identity = [
        FieldChange(name, jsonable(getattr(old, name)), jsonable(getattr(new, name)))
        for name in ("kind", "shape", "dtype", "logical")
        if getattr(old, name) != getattr(new, name)
    ]
    details: list[Detail] = list(identity)
    if old.spec != new.spec:
        if len(old.spec) == len(new.spec):
            details.extend(dim_changes(old, new))
        else:
            identity.append(FieldChange("spec", jsonable(old.spec), jsonable(new.spec)))
            details.append(identity[-1])
    for name in ("shard_shape", "bytes_per_device"):
        if getattr(old, name) != getattr(new, name):
            details.append(FieldChange(name, jsonable(getattr(old, name)), jsonable(getattr(new, name))))
    kind = ChangeKind.SPEC_CHANGED if old.spec != new.spec and not identity else ChangeKind.TENSOR_CHANGED
    return Change(kind, path, old, new, tuple(details))


def _diff_tensors(old: Plan, new: Plan) -> tuple[list[Change], tuple[tuple[str, TensorRecord], ...]]:
    before, after = old.tensor_map, new.tensor_map
    changes: list[Change] = []
    unchanged = []
    for path in sorted(before.keys() | after.keys()):
        was, now = before.get(path), after.get(path)
        if now is None and was is not None:
            changes.append(Change(ChangeKind.TENSOR_REMOVED, path, was, None))
        elif was is None and now is not None:
            changes.append(Change(ChangeKind.TENSOR_ADDED, path, None, now))
        elif was is not None and now is not None:
            if was == now:
                unchanged.append((path, was))
            else:
                changes.append(_tensor_change(path, was, now))
    return changes, tuple(unchanged)


def collective_key(row: CollectiveRow) -> CollectiveKey:
    """A row's identity; rows of one key on both sides are the same collective, maybe moved in size."""
    return (row.op, row.axes, row.groups, row.dtype, row.shape, row.pass_, row.source, row.shift)


def _distinct(values: Sequence[int | None]) -> int | tuple[int | None, ...] | None:
    unique = sorted(set(values), key=lambda v: (v is None, v or 0))
    return unique[0] if len(unique) == 1 else tuple(unique)


def _profile(rows: Sequence[CollectiveRow]) -> tuple[tuple[int, int | None, int], ...]:
    # Rows of one key compare by how many instructions run at which (bytes, trips), however they were split.
    counts: dict[tuple[int, int | None], int] = defaultdict(int)
    for row in rows:
        counts[(row.bytes, row.loop_trips)] += row.count
    return tuple(sorted(((b, t, n) for (b, t), n in counts.items()), key=repr))


def _link_mark(row: CollectiveRow) -> str:
    """ " (NVLink)" or " (network)" on a GPU cluster's row, as its plan's tables print it; "" elsewhere."""
    return {"nvlink": " (NVLink)", "network": " (network)"}.get(row.link or "", "")


def collective_side(key: CollectiveKey, rows: Sequence[CollectiveRow]) -> CollectiveSide:
    """The rows of one key aggregated: identity fields, then count/bytes/trips/traffic and the merged cause."""
    op, axes, groups, dtype, shape, pass_, source, shift = key
    traffic = [r.traffic for r in rows]
    return CollectiveSide(
        op=op,
        axes=axes,
        axes_label=axes_label(rows[0]) + _link_mark(rows[0]),
        groups=groups,
        dtype=dtype,
        shape=shape,
        pass_=pass_,
        source=source,
        shift=shift,
        count=sum(r.count for r in rows),
        bytes=_distinct([r.bytes for r in rows]),
        loop_trips=_distinct([r.loop_trips for r in rows]),
        traffic=None if None in traffic else sum(t for t in traffic if t is not None),
        cause=merged_cause([r.cause for r in rows]),
    )


def collective_subject(key: CollectiveKey, rows: Sequence[CollectiveRow]) -> str:
    """A one-line name: "all-gather over fsdp+expert float32[64,32] forward at decoder/…/wq_a"."""
    op, _, _, dtype, shape, pass_, source, shift = key
    shift_text = f" shift {shift:+d}" if shift is not None else ""
    return (
        f"{op} over {axes_label(rows[0])}{_link_mark(rows[0])}{shift_text} {dtype}[{','.join(map(str, shape))}] "
        f"{pass_} at {source or '(top level)'}"
    )


def _collective_order(key: CollectiveKey) -> tuple[Any, ...]:
    # Reading order: by module (source), then pass in step order, then op; the repr breaks ties totally.
    op, _, _, _, _, pass_, source, _ = key
    pass_rank = PASSES.index(pass_) if pass_ in PASSES else len(PASSES)
    return (source, pass_rank, op, repr(key))


def _diff_collectives(old: Plan, new: Plan) -> tuple[list[Change], tuple[CollectiveRow, ...]]:
    before: dict[CollectiveKey, list[CollectiveRow]] = defaultdict(list)
    after: dict[CollectiveKey, list[CollectiveRow]] = defaultdict(list)
    for row in old.collectives:
        before[collective_key(row)].append(row)
    for row in new.collectives:
        after[collective_key(row)].append(row)
    changes: list[Change] = []
    unchanged: list[CollectiveRow] = []
    for key in sorted(before.keys() | after.keys(), key=_collective_order):
        was, now = before.get(key), after.get(key)
        rows = was or now or []
        subject = collective_subject(key, rows)
        if not now:
            changes.append(Change(ChangeKind.COLLECTIVE_REMOVED, subject, collective_side(key, rows), None))
        elif not was:
            changes.append(Change(ChangeKind.COLLECTIVE_ADDED, subject, None, collective_side(key, rows)))
        elif _profile(was) == _profile(now):
            unchanged.extend(was)
        else:
            old_row, new_row = collective_side(key, was), collective_side(key, now)
            details = tuple(
                FieldChange(name, getattr(old_row, name), getattr(new_row, name))
                for name in ("count", "bytes", "loop_trips", "traffic")
                if getattr(old_row, name) != getattr(new_row, name)
            )
            changes.append(Change(ChangeKind.COLLECTIVE_CHANGED, subject, old_row, new_row, details))
    return changes, tuple(unchanged)


def _diff_findings(old: Plan, new: Plan, compiled: bool) -> tuple[list[Change], tuple[Finding, ...]]:
    """Findings resolved, added or changed (matched by lint and subject), and those both plans hold; with
    `compiled` false (a plan holds tensors only) the findings of lints that need the compiled step are not
    compared."""

    def comparable(findings: tuple[Finding, ...]) -> dict[tuple[str, str], Finding]:
        kept = [f for f in findings if compiled or f.lint not in LINTS or LINTS[f.lint].stage != COMPILE]
        return {f.key: f for f in sort_findings(kept)}

    before, after = comparable(old.findings), comparable(new.findings)
    changes = []
    unchanged = tuple(f for key, f in after.items() if before.get(key) == f)
    for key in [*before, *(k for k in after if k not in before)]:
        was, now = before.get(key), after.get(key)
        if now is None and was is not None:
            changes.append(Change(ChangeKind.FINDING_RESOLVED, f"{was.lint}: {was.subject}", was, None))
        elif was is None and now is not None:
            changes.append(Change(ChangeKind.FINDING_ADDED, f"{now.lint}: {now.subject}", None, now))
        elif was is not None and now is not None and was != now:
            details = tuple(
                FieldChange(name, getattr(was, name), getattr(now, name))
                for name in ("severity", "subject", "message", "fix")
                if getattr(was, name) != getattr(now, name)
            )
            subject = f"{now.lint}: {now.subject}"
            changes.append(Change(ChangeKind.FINDING_CHANGED, subject, was, now, details))
    return changes, unchanged


def holds(plan: Plan) -> str:
    """What a plan holds, in a few words for its header."""
    provenance = dict(plan.provenance)
    if provenance.get("source") == "maxtext sharding dump":
        return "MaxText's dump, tensors only"
    if provenance.get("predicted"):
        return "collectives predicted, nothing compiled"
    return "compiled" if plan.holds("collectives") else "tensors only"


def _compared(case: CaseRecord) -> dict[str, Any]:
    """The case fields a diff compares: the mesh by the axes that split devices (two meshes that differ only
    in axes of size 1 place every tensor alike)."""
    return case_dict(case) | {"mesh": format_mesh(tuple(_sized(case.mesh).items()))}


def _readable_mesh(change: Change, old: Plan, new: Plan) -> Change:
    """A mesh change, shown by the axes that split devices (MaxText's default mesh has twelve axes)."""
    if change.subject != "mesh":
        return change
    return dataclasses.replace(change, before=mesh_label(old.case.mesh), after=mesh_label(new.case.mesh))


def _backend_notes(old: Plan, new: Plan) -> list[str]:
    """Why collectives and memory may differ although the rules did not change: another compiler."""
    before, after = dict(old.provenance).get("backend"), dict(new.provenance).get("backend")
    if before == after:
        return []
    if {before, after} == {"tpu", "gpu"}:
        return [
            f"the plans are of different platforms ({before} → {after}): tensor shardings compare; collectives, "
            "memory and work are each compiler's own, each plan is priced on its own hardware, and 'Traffic per "
            "network' pairs what stays inside a TPU slice (ICI) or an NVLink domain, and what crosses between "
            "slices (DCN, inferred from the parameters' shardings) or domains (the network)"
        ]
    return [
        f"backend differs ({before} → {after}): collective schedules and memory are each compiler's own and "
        "may differ while tensor shardings agree"
    ]


def _root_changes(
    kind: ChangeKind, before: Mapping[str, Any], after: Mapping[str, Any], **deepdiff_args: Any
) -> list[Change]:
    """One change per top-level key that DeepDiff finds different (added, removed or moved inside)."""
    found = DeepDiff(dict(before), dict(after), **deepdiff_args)
    keys = sorted(str(k) for k in found.affected_root_keys)
    return [Change(kind, key, jsonable(before.get(key)), jsonable(after.get(key))) for key in keys]


def within_tolerance(before: int, after: int, tolerance: float) -> bool:
    """|after − before| ≤ tolerance × the larger side (symmetric, so diff(a, b) and diff(b, a) agree)."""
    return abs(after - before) <= tolerance * max(abs(before), abs(after))


def _diff_figures(
    kind: ChangeKind, before: dict[str, int], after: dict[str, int], tolerant: Sequence[str], tolerance: float
) -> tuple[list[Change], list[str]]:
    """Changes of a flat dict of compiler figures, those in `tolerant` allowed to move within `tolerance`."""
    exact = [f"root[{name!r}]" for name in tolerant if name in before and name in after]
    changes = _root_changes(kind, before, after, exclude_paths=exact)
    notes = []
    for name in tolerant:
        if name not in before or name not in after or before[name] == after[name]:
            continue
        move = after[name] - before[name]
        relative = move / max(abs(before[name]), abs(after[name]))
        if within_tolerance(before[name], after[name], tolerance):
            notes.append(f"{name} moved by {move:+d} B ({relative:+.2%}), within the {tolerance:.0%} tolerance")
        else:
            changes.append(Change(kind, name, before[name], after[name]))
    return sorted(changes, key=lambda c: c.subject), notes


def _diff_memory(old: Plan, new: Plan, tolerance: float) -> tuple[list[Change], list[str]]:
    return _diff_figures(
        ChangeKind.MEMORY_CHANGED, dict(old.memory), dict(new.memory), TOLERANT_MEMORY_FIELDS, tolerance
    )


def _diff_compute(old: Plan, new: Plan, tolerance: float) -> tuple[list[Change], list[str]]:
    # A plan written before work figures were recorded has none: nothing to compare, not a change.
    if not old.compute or not new.compute:
        return [], []
    return _diff_figures(
        ChangeKind.COMPUTE_CHANGED, dict(old.compute), dict(new.compute), TOLERANT_COMPUTE_FIELDS, tolerance
    )


def _sized(mesh: Sequence[tuple[str, int]]) -> dict[str, int]:
    # Axes of size 1 shard nothing: two meshes that differ only in those place every tensor alike.
    return {axis: size for axis, size in mesh if size > 1}


def diff_plans(
    old: Plan,
    new: Plan,
    *,
    temp_tolerance: float = DEFAULT_TEMP_TOLERANCE,
    hardware: str | None = None,
    efficiency: float | None = None,
) -> PlanDiff:
    """Compares two plans by meaning; provenance and estimates are never part of the verdict.

    Args:
      old: the baseline (a golden, the plan before a change).
      new: the candidate.
      temp_tolerance: relative move of `temp_bytes` (and `peak_bytes`, `bytes_accessed`) that is not a change (see
        DEFAULT_TEMP_TOLERANCE).
      hardware, efficiency: price both plans on this TPU generation (see `price_pair`).

    Returns:
      A PlanDiff whose changes are ordered case, extra, memory, tensors (by path), collectives (by
      source, pass, op), lint findings (most severe first).
    """
    changes = [
        _readable_mesh(c, old, new) for c in _root_changes(ChangeKind.CASE, _compared(old.case), _compared(new.case))
    ]
    changes += _root_changes(ChangeKind.EXTRA_CHANGED, dict(old.extra), dict(new.extra))
    # Only what both plans hold is compared: a tensors-only plan (no compile) has no collectives or memory.
    shared = set(old.parts) & set(new.parts)
    memory_changes: list[Change] = []
    notes: list[str] = []
    if "memory" in shared:
        memory_changes, notes = _diff_memory(old, new, temp_tolerance)
    compute_changes, compute_notes = _diff_compute(old, new, temp_tolerance)
    notes += compute_notes
    cost_before, cost_after, cost_notes = price_pair(old, new, hardware, efficiency)
    notes += cost_notes
    missing = [part for part in ("collectives", "memory") if part not in shared]
    if missing:
        holder = "both plans hold" if not ({*old.parts, *new.parts} - {"tensors"}) else "one plan holds"
        notes.append(f"{holder} tensors only (made without compiling): {' and '.join(missing)} not compared")
    notes += _backend_notes(old, new)
    tensor_changes, unchanged_tensors = _diff_tensors(old, new)
    compare_collectives = "collectives" in shared
    collective_changes, unchanged_collectives = _diff_collectives(old, new) if compare_collectives else ([], ())
    kept_rows = (old.collectives, new.collectives) if compare_collectives else ((), ())
    finding_changes, unchanged_findings = _diff_findings(old, new, compare_collectives)
    networks = paired_networks(old, new)
    rule_changes, compilers_choices = explain_collective_changes(
        tensor_changes + collective_changes, mesh_changed=_sized(old.case.mesh) != _sized(new.case.mesh)
    )
    return PlanDiff(
        old_case=old.case,
        new_case=new.case,
        changes=tuple(
            changes + memory_changes + compute_changes + tensor_changes + collective_changes + finding_changes
        ),
        totals_before=traffic_totals(kept_rows[0]),
        totals_after=traffic_totals(kept_rows[1]),
        memory_before=old.memory if "memory" in shared else (),
        memory_after=new.memory if "memory" in shared else (),
        kinds_before=bytes_by_kind(old),
        kinds_after=bytes_by_kind(new),
        unchanged_tensors=unchanged_tensors,
        unchanged_collectives=unchanged_collectives,
        temp_tolerance=temp_tolerance,
        notes=tuple(notes),
        provenance_before=old.provenance,
        provenance_after=new.provenance,
        unchanged_findings=unchanged_findings,
        cost_before=cost_before,
        cost_after=cost_after,
        rule_changes=rule_changes,
        compilers_choices=compilers_choices,
        old_holds=holds(old),
        new_holds=holds(new),
        networks_before=networks[0] if compare_collectives else (),
        networks_after=networks[1] if compare_collectives else (),
    )
