"""Plan × Plan → changes: a diff by meaning (which dimension gained which mesh axis), not by text.

DeepDiff stays inside this module: it compares the flat case header, the memory dicts and any extra
top-level plan fields; tensors and collectives are aligned by hand because their identity (a path, a
collective key) is domain knowledge. Every change carries plain, JSON-able values only.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deepdiff import DeepDiff

from shardscope.cost.estimate import Estimate
from shardscope.errors import ShardscopeError
from shardscope.lint.catalogue import COMPILE, LINTS
from shardscope.lint.finding import Finding, finding_to_json, sort_findings
from shardscope.plan import PASSES, CaseRecord, CollectiveRow, Plan, TensorRecord
from shardscope.rules import SpecEntry
from shardscope.summary import TrafficTotals, axes_label, bytes_by_kind, traffic_totals
from shardscope.topology import format_mesh as mesh_text
from shardscope.topology import mesh_label

# `temp_bytes` is the scratch space XLA's buffer assignment chose; it depends on fusion and scheduling
# heuristics that may read the host (CPU features, thread count), so it can differ slightly between two
# machines of one kind even though it repeats exactly on one machine. 2% absorbs such noise while a real
# change still stands out (default → ep-as-cp moves it by 7% for deepseek-tiny).
DEFAULT_TEMP_TOLERANCE = 0.02
TOLERANT_MEMORY_FIELDS = ("temp_bytes",)

TENSOR_KINDS = ("tensor_removed", "tensor_added", "tensor_changed", "spec_changed")
COLLECTIVE_KINDS = ("collective_removed", "collective_added", "collective_changed")
# Lint findings a change resolved, added, or changed the figures of (same lint, same subject).
FINDING_KINDS = ("finding_resolved", "finding_added", "finding_changed")
# Every kind of change, in report order; "extra_changed" covers unknown top-level plan fields.
CHANGE_KINDS = (
    "case",
    "extra_changed",
    "memory_changed",
    "compute_changed",
    *TENSOR_KINDS,
    *COLLECTIVE_KINDS,
    *FINDING_KINDS,
)
# Compiled work figures that follow fusion decisions, compared with the temp_bytes tolerance.
TOLERANT_COMPUTE_FIELDS = ("bytes_accessed",)

# The identity of a collective row: (op, axes, groups, dtype, shape, pass, source, shift).
CollectiveKey = tuple[str, tuple[str, ...] | None, str | None, str, tuple[int, ...], str, str, int | None]


@dataclass(frozen=True)
class DimChange:
    """One tensor dimension whose spec entry changed."""

    dim: int
    logical: str | None
    before: SpecEntry
    after: SpecEntry
    axes_added: tuple[str, ...]
    axes_dropped: tuple[str, ...]  # both empty: the same axes in another order (another device layout)


@dataclass(frozen=True)
class FieldChange:
    """A field that moved: a tensor's shape or bytes per device, a collective's count, ..."""

    field: str
    before: Any
    after: Any


Detail = DimChange | FieldChange


@dataclass(frozen=True)
class Change:
    """One semantic difference between two plans.

    `before`/`after` are plain values (None on the side where the subject is absent): the tensor as its
    JSON dict, the aggregated collective row as a dict, a memory or case field's value.
    """

    kind: str
    subject: str
    before: Any
    after: Any
    details: tuple[Detail, ...] = ()

    @property
    def dims(self) -> tuple[DimChange, ...]:
        """The per-dimension spec changes among the details."""
        return tuple(d for d in self.details if isinstance(d, DimChange))

    @property
    def fields(self) -> tuple[FieldChange, ...]:
        """The field changes among the details."""
        return tuple(d for d in self.details if isinstance(d, FieldChange))


@dataclass(frozen=True)
class PlanDiff:
    """Everything a report needs: the changes, and the totals of both sides for the headline."""

    old_case: CaseRecord
    new_case: CaseRecord
    changes: tuple[Change, ...]
    totals_before: TrafficTotals
    totals_after: TrafficTotals
    memory_before: tuple[tuple[str, int], ...]
    memory_after: tuple[tuple[str, int], ...]
    kinds_before: tuple[tuple[str, int, int], ...]  # (tensor kind, count, bytes per device)
    kinds_after: tuple[tuple[str, int, int], ...]
    unchanged_tensors: tuple[tuple[str, TensorRecord], ...]
    unchanged_collectives: tuple[CollectiveRow, ...]
    temp_tolerance: float
    notes: tuple[str, ...] = field(default=())  # e.g. a temp_bytes move within tolerance
    # Shown to explain a diff (a new JAX version), never compared.
    provenance_before: tuple[tuple[str, Any], ...] = field(default=())
    provenance_after: tuple[tuple[str, Any], ...] = field(default=())
    unchanged_findings: tuple[Finding, ...] = field(default=())  # lint findings both plans hold
    # Both plans priced on one target (`shardscope.cost.price`), or None when neither has one; shown, and
    # never part of the verdict: an estimate is derived from what is compared above.
    cost_before: Estimate | None = None
    cost_after: Estimate | None = None

    @property
    def same(self) -> bool:
        """No difference outside provenance (and outside the stated temp_bytes tolerance)."""
        return not self.changes

    def of_kind(self, *kinds: str) -> tuple[Change, ...]:
        """The changes of the given kinds, in diff order."""
        return tuple(c for c in self.changes if c.kind in kinds)

    def tensor_changes_frame(self) -> Any:
        """The tensor changes as a pandas DataFrame (see `shardscope.tables.tensor_changes_frame`)."""
        from shardscope.tables import tensor_changes_frame

        return tensor_changes_frame(self)

    def collective_changes_frame(self) -> Any:
        """The collective changes as a pandas DataFrame (see `shardscope.tables.collective_changes_frame`)."""
        from shardscope.tables import collective_changes_frame

        return collective_changes_frame(self)


def spec_axes(entry: SpecEntry) -> tuple[str, ...]:
    """The mesh axes of one spec entry: None → (), "fsdp" → ("fsdp",)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def unit_axes(old: CaseRecord, new: CaseRecord) -> frozenset[str]:
    """Mesh axes of size 1 on both sides (a missing axis counts as 1): adding or dropping them places
    every shard on the same device as before, so reports mark them instead of alarming."""
    sizes_old, sizes_new = dict(old.mesh), dict(new.mesh)
    names = sizes_old.keys() | sizes_new.keys()
    return frozenset(a for a in names if sizes_old.get(a, 1) == 1 and sizes_new.get(a, 1) == 1)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def tensor_dict(tensor: TensorRecord) -> dict[str, Any]:
    """A tensor record as plain JSON-able data (the plan's own spelling)."""
    return {
        "kind": tensor.kind,
        "shape": list(tensor.shape),
        "dtype": tensor.dtype,
        "logical": _jsonable(tensor.logical),
        "spec": _jsonable(tensor.spec),
        "shard_shape": list(tensor.shard_shape),
        "bytes_per_device": tensor.bytes_per_device,
    }


def dim_changes(old: TensorRecord, new: TensorRecord) -> tuple[DimChange, ...]:
    """Per dimension of equal-rank specs: which entries changed, which axes were added and dropped."""
    changes = []
    for dim, (before, after) in enumerate(zip(old.spec, new.spec, strict=True)):
        if before == after:
            continue
        was, now = spec_axes(before), spec_axes(after)
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
        FieldChange(name, _jsonable(getattr(old, name)), _jsonable(getattr(new, name)))
        for name in ("kind", "shape", "dtype", "logical")
        if getattr(old, name) != getattr(new, name)
    ]
    details: list[Detail] = list(identity)
    if old.spec != new.spec:
        if len(old.spec) == len(new.spec):
            details.extend(dim_changes(old, new))
        else:
            identity.append(FieldChange("spec", _jsonable(old.spec), _jsonable(new.spec)))
            details.append(identity[-1])
    for name in ("shard_shape", "bytes_per_device"):
        if getattr(old, name) != getattr(new, name):
            details.append(FieldChange(name, _jsonable(getattr(old, name)), _jsonable(getattr(new, name))))
    kind = "spec_changed" if old.spec != new.spec and not identity else "tensor_changed"
    return Change(kind, path, tensor_dict(old), tensor_dict(new), tuple(details))


def _diff_tensors(old: Plan, new: Plan) -> tuple[list[Change], tuple[tuple[str, TensorRecord], ...]]:
    before, after = old.tensor_map, new.tensor_map
    changes: list[Change] = []
    unchanged = []
    for path in sorted(before.keys() | after.keys()):
        was, now = before.get(path), after.get(path)
        if now is None and was is not None:
            changes.append(Change("tensor_removed", path, tensor_dict(was), None))
        elif was is None and now is not None:
            changes.append(Change("tensor_added", path, None, tensor_dict(now)))
        elif was is not None and now is not None:
            if was == now:
                unchanged.append((path, was))
            else:
                changes.append(_tensor_change(path, was, now))
    return changes, tuple(unchanged)


def collective_key(row: CollectiveRow) -> CollectiveKey:
    """A row's identity; rows of one key on both sides are the same collective, maybe moved in size."""
    return (row.op, row.axes, row.groups, row.dtype, row.shape, row.pass_, row.source, row.shift)


def _distinct(values: Sequence[Any]) -> Any:
    unique = sorted(set(values), key=lambda v: (v is None, v or 0))
    return unique[0] if len(unique) == 1 else unique


def _profile(rows: Sequence[CollectiveRow]) -> tuple[tuple[int, int | None, int], ...]:
    # Rows of one key compare by how many instructions run at which (bytes, trips), however they were split.
    counts: dict[tuple[int, int | None], int] = defaultdict(int)
    for row in rows:
        counts[(row.bytes, row.loop_trips)] += row.count
    return tuple(sorted(((b, t, n) for (b, t), n in counts.items()), key=repr))


def _stats(rows: Sequence[CollectiveRow]) -> dict[str, Any]:
    traffic = [r.traffic for r in rows]
    return {
        "count": sum(r.count for r in rows),
        "bytes": _distinct([r.bytes for r in rows]),
        "loop_trips": _distinct([r.loop_trips for r in rows]),
        "traffic": None if None in traffic else sum(t for t in traffic if t is not None),
    }


def collective_dict(key: CollectiveKey, rows: Sequence[CollectiveRow]) -> dict[str, Any]:
    """The aggregated rows of one key as plain data: identity fields, then count/bytes/trips/traffic."""
    op, axes, groups, dtype, shape, pass_, source, shift = key
    data: dict[str, Any] = {
        "op": op,
        "axes": _jsonable(axes),
        "axes_label": axes_label(rows[0]),
        "groups": groups,
        "dtype": dtype,
        "shape": list(shape),
        "pass": pass_,
        "source": source,
        "shift": shift,
    }
    data.update(_stats(rows))
    return data


def collective_subject(key: CollectiveKey, rows: Sequence[CollectiveRow]) -> str:
    """A one-line name: "all-gather over fsdp+expert float32[64,32] forward at decoder/…/wq_a"."""
    op, _, _, dtype, shape, pass_, source, shift = key
    shift_text = f" shift {shift:+d}" if shift is not None else ""
    return (
        f"{op} over {axes_label(rows[0])}{shift_text} {dtype}[{','.join(map(str, shape))}] "
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
            changes.append(Change("collective_removed", subject, collective_dict(key, rows), None))
        elif not was:
            changes.append(Change("collective_added", subject, None, collective_dict(key, rows)))
        elif _profile(was) == _profile(now):
            unchanged.extend(was)
        else:
            old_row, new_row = collective_dict(key, was), collective_dict(key, now)
            details = tuple(
                FieldChange(name, old_row[name], new_row[name])
                for name in ("count", "bytes", "loop_trips", "traffic")
                if old_row[name] != new_row[name]
            )
            changes.append(Change("collective_changed", subject, old_row, new_row, details))
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
            changes.append(Change("finding_resolved", f"{was.lint}: {was.subject}", finding_to_json(was), None))
        elif was is None and now is not None:
            changes.append(Change("finding_added", f"{now.lint}: {now.subject}", None, finding_to_json(now)))
        elif was is not None and now is not None and was != now:
            details = tuple(
                FieldChange(name, getattr(was, name), getattr(now, name))
                for name in ("severity", "subject", "message", "fix")
                if getattr(was, name) != getattr(now, name)
            )
            subject = f"{now.lint}: {now.subject}"
            changes.append(Change("finding_changed", subject, finding_to_json(was), finding_to_json(now), details))
    return changes, unchanged


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
    return [
        f"backend differs ({before} → {after}): collective schedules and memory are each compiler's own and "
        "may differ while tensor shardings agree"
    ]


def case_dict(case: CaseRecord) -> dict[str, Any]:
    """The case header as plain data; the mesh as its ordered CLI spelling."""
    return {
        "model": case.model,
        "preset": case.preset,
        "topology": case.topology,
        "mesh": mesh_text(case.mesh),
        "axis_types": case.axis_types,
        "overrides": dict(case.overrides),
    }


def _root_changes(kind: str, before: Mapping[str, Any], after: Mapping[str, Any], **deepdiff_args: Any) -> list[Change]:
    """One change per top-level key that DeepDiff finds different (added, removed or moved inside)."""
    found = DeepDiff(dict(before), dict(after), **deepdiff_args)
    keys = sorted(str(k) for k in found.affected_root_keys)
    return [Change(kind, key, _jsonable(before.get(key)), _jsonable(after.get(key))) for key in keys]


def within_tolerance(before: int, after: int, tolerance: float) -> bool:
    """|after − before| ≤ tolerance × the larger side (symmetric, so diff(a, b) and diff(b, a) agree)."""
    return abs(after - before) <= tolerance * max(abs(before), abs(after))


def _diff_figures(
    kind: str, before: dict[str, int], after: dict[str, int], tolerant: Sequence[str], tolerance: float
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
    return _diff_figures("memory_changed", dict(old.memory), dict(new.memory), TOLERANT_MEMORY_FIELDS, tolerance)


def _diff_compute(old: Plan, new: Plan, tolerance: float) -> tuple[list[Change], list[str]]:
    # A plan written before work figures were recorded has none: nothing to compare, not a change.
    if not old.compute or not new.compute:
        return [], []
    return _diff_figures("compute_changed", dict(old.compute), dict(new.compute), TOLERANT_COMPUTE_FIELDS, tolerance)


def price_pair(
    old: Plan, new: Plan, hardware: str | None = None, efficiency: float | None = None
) -> tuple[Estimate | None, Estimate | None, list[str]]:
    """Both plans priced on one target, so their times compare: `hardware` if named, else the generation
    either plan was priced on (the new one first), else each TPU plan's own topology.

    Raises:
      ShardscopeError: a named `hardware` the plans cannot be priced on (unknown, or a mesh that is no
        slice of it). Without one, a side that cannot be priced is left out with a note.
    """
    from shardscope.cost.price import price_plan

    chosen = hardware
    if chosen is None:
        priced = [plan.estimate for plan in (new, old) if plan.estimate is not None]
        if priced:
            chosen = priced[0].hardware
            if efficiency is None and priced[0].efficiency_source == "caller":
                efficiency = priced[0].efficiency
    sides: list[Estimate | None] = []
    notes: list[str] = []
    for name, plan in (("old", old), ("new", new)):
        try:
            sides.append(price_plan(plan, chosen, efficiency).estimate)
        except ShardscopeError as err:
            if hardware is not None:
                raise
            sides.append(None)
            notes.append(f"the {name} plan is not priced: {err}")
    if chosen is None and (sides[0] is None) != (sides[1] is None):
        # One TPU plan and one CPU plan: price the CPU side as the TPU side's generation.
        target = (sides[0] or sides[1]).hardware  # type: ignore[union-attr]
        return price_pair(old, new, target, efficiency)
    return sides[0], sides[1], notes


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
      temp_tolerance: relative move of `temp_bytes` (and `bytes_accessed`) that is not a change (see
        DEFAULT_TEMP_TOLERANCE).
      hardware, efficiency: price both plans on this TPU generation (see `price_pair`).

    Returns:
      A PlanDiff whose changes are ordered case, extra, memory, tensors (by path), collectives (by
      source, pass, op), lint findings (most severe first).
    """
    changes = [_readable_mesh(c, old, new) for c in _root_changes("case", case_dict(old.case), case_dict(new.case))]
    changes += _root_changes("extra_changed", dict(old.extra), dict(new.extra))
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
    )


@dataclass(frozen=True)
class TensorGroup:
    """A tensor change and its mirrors: tensors that follow a parameter (its optimizer state, its output)
    and changed in exactly the same way, so a report can show the cause once."""

    change: Change
    mirrors: tuple[str, ...] = ()


def _signature(change: Change) -> tuple[Any, ...]:
    def strip(side: Any) -> Any:
        return None if side is None else repr({k: v for k, v in side.items() if k != "kind"})

    return (change.kind, strip(change.before), strip(change.after))


def group_tensor_changes(changes: Iterable[Change]) -> tuple[TensorGroup, ...]:
    """Folds `opt_state/0/mu/X`, `outputs/params/X`, … into the change of `params/X` when identical.

    A mirror whose change differs from its parameter's stays a group of its own, so an optimizer state
    sharded unlike its parameter still stands out.
    """
    tensor_changes = [c for c in changes if c.kind in TENSOR_KINDS]
    leads = {c.subject: c for c in tensor_changes if c.subject.startswith("params/")}
    mirrors: dict[str, list[str]] = defaultdict(list)
    for change in tensor_changes:
        if change.subject in leads:
            continue
        parts = change.subject.split("/")
        for start in range(1, len(parts)):
            lead = leads.get("params/" + "/".join(parts[start:]))
            if lead is not None and _signature(lead) == _signature(change):
                mirrors[lead.subject].append(change.subject)
                break
    folded = {path for paths in mirrors.values() for path in paths}
    return tuple(TensorGroup(c, tuple(mirrors.get(c.subject, ()))) for c in tensor_changes if c.subject not in folded)


def diff_to_json(diff: PlanDiff) -> dict[str, Any]:
    """A diff as plain JSON data: the verdict, the notes, every change (with its per-dimension and per-field
    details) and the traffic totals before and after."""

    def detail(d: Detail) -> dict[str, Any]:
        if isinstance(d, DimChange):
            return {
                "dim": d.dim,
                "logical": d.logical,
                "before": _jsonable(d.before),
                "after": _jsonable(d.after),
                "axes_added": list(d.axes_added),
                "axes_dropped": list(d.axes_dropped),
            }
        return {"field": d.field, "before": _jsonable(d.before), "after": _jsonable(d.after)}

    def totals(t: TrafficTotals) -> dict[str, Any]:
        return {"total": t.total, "by_axes": dict(t.by_axes), "by_op": dict(t.by_op), "by_pass": dict(t.by_pass)}

    def cost(estimate: Estimate | None) -> dict[str, Any] | None:
        if estimate is None:
            return None
        from shardscope.cost.estimate_json import estimate_to_json

        # The per-row times stay in the plans' own estimates; a diff carries the totals.
        return {k: v for k, v in estimate_to_json(estimate).items() if k not in ("rows", "cross_slice")}

    return {
        "same": diff.same,
        "cost_before": cost(diff.cost_before),
        "cost_after": cost(diff.cost_after),
        "old": case_dict(diff.old_case),
        "new": case_dict(diff.new_case),
        "notes": list(diff.notes),
        "changes": [
            {
                "kind": c.kind,
                "subject": c.subject,
                "before": _jsonable(c.before),
                "after": _jsonable(c.after),
                "details": [detail(d) for d in c.details],
            }
            for c in diff.changes
        ],
        "traffic_before": totals(diff.totals_before),
        "traffic_after": totals(diff.totals_after),
        "unchanged_tensors": len(diff.unchanged_tensors),
        "unchanged_collectives": len(diff.unchanged_collectives),
        "unchanged_findings": len(diff.unchanged_findings),
    }
