"""How reports group a diff: a parameter's change shown once with its mirrors (optimizer state, outputs),
and the mesh axes of size 1 on both sides, which move no data."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shardscope.diff.changes import Change
from shardscope.diff.kinds import TENSOR_CHANGE_KINDS
from shardscope.plan.records import CaseRecord


def unit_axes(old: CaseRecord, new: CaseRecord) -> frozenset[str]:
    """Mesh axes of size 1 on both sides (a missing axis counts as 1): adding or dropping them places
    every shard on the same device as before, so reports mark them instead of alarming."""
    sizes_old, sizes_new = dict(old.mesh), dict(new.mesh)
    names = sizes_old.keys() | sizes_new.keys()
    return frozenset(a for a in names if sizes_old.get(a, 1) == 1 and sizes_new.get(a, 1) == 1)


@dataclass(frozen=True)
class TensorGroup:
    """A tensor change and its mirrors: tensors that follow a parameter (its optimizer state, its output)
    and changed in exactly the same way, so a report can show the cause once."""

    change: Change
    mirrors: tuple[str, ...] = ()


def _signature(change: Change) -> tuple[Any, ...]:
    # A mirror is another kind of tensor (opt_state, output) with the very same change.
    before, after = (None if side is None else dataclasses.replace(side, kind="") for side in change.tensor_sides)
    return (change.kind, before, after)


def group_tensor_changes(changes: Iterable[Change]) -> tuple[TensorGroup, ...]:
    """Folds `opt_state/0/mu/X`, `outputs/params/X`, … into the change of `params/X` when identical.

    A mirror whose change differs from its parameter's stays a group of its own, so an optimizer state
    sharded unlike its parameter still stands out.
    """
    tensor_changes = [c for c in changes if c.kind in TENSOR_CHANGE_KINDS]
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
