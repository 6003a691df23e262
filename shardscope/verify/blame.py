"""Where a diverging tensor lives on each side, and which collectives of a preset side's compiled plan touch
it (the plan's collectives name what they move in `cause.tensors`; see `shardscope why`)."""

from __future__ import annotations

from collections.abc import Sequence

from shardscope.case.rules import Spec
from shardscope.plan.document import Plan
from shardscope.plan.frames import spec_axes_text
from shardscope.plan.records import CollectiveRow, axes_label
from shardscope.verify.records import CollectiveNote, Placement, TensorCheck
from shardscope.verify.run import SideRun

# How a tensor is held on a side that runs on one device.
WHOLE = "whole, on one device"


def related_tensors(path: str) -> frozenset[str]:
    """The plan tensors whose collectives bear on a compared output: a gradient's own (`grads/params/…`); a
    parameter's, its gradient's (its update reads it); a moment's, its gradient's and its parameter's."""
    if path.startswith("grads/"):
        return frozenset({path})
    for prefix in ("opt_state/0/mu/", "opt_state/0/nu/"):
        if path.startswith(prefix):
            param = "params/" + path.removeprefix(prefix)
            return frozenset({path, "grads/" + param})
    if path.startswith("params/"):
        return frozenset({path, "grads/" + path})
    return frozenset({path})


def _touches_loss(tensors: Sequence[str]) -> bool:
    """A collective on the loss: what it moves is the step's output, or an op outside every model module
    (`ops/reduce_sum`: the loss is computed from the logits outside the model)."""
    return any(t in ("outputs/loss", "loss") or (t.startswith("ops/") and t.count("/") == 1) for t in tensors)


def touching(plan: Plan, path: str) -> tuple[CollectiveRow, ...]:
    """The collectives of a plan whose cause names the tensor (or the tensors its value is made from)."""
    wanted = related_tensors(path)
    found = []
    for row in plan.collectives:
        if row.cause is None:
            continue
        tensors = row.cause.tensors
        if wanted.intersection(tensors) or (path == "loss" and _touches_loss(tensors)):
            found.append(row)
    return tuple(found)


def collective_note(row: CollectiveRow) -> CollectiveNote:
    """A plan row as the report names it."""
    cause = row.cause
    return CollectiveNote(
        op=row.op,
        axes=axes_label(row),
        pass_=row.pass_,
        consumer=cause.consumer if cause is not None else row.source,
        line=cause.line if cause is not None else None,
    )


def _spec_text(spec: Spec) -> str:
    """`(fsdp+expert, -)`; a scalar has no dimension to split: on every device."""
    return spec_axes_text(spec) if spec else "(), on every device"


def placement(side: SideRun, path: str, plan: Plan | None) -> Placement:
    """Where a compared output lives on a side, with the collectives of its plan that touch it."""
    if not side.specs:
        return Placement(side.label, WHOLE)
    own = side.paths_of(path)
    specs = dict.fromkeys(_spec_text(side.specs[p]) for p in own if p in side.specs)
    notes: dict[CollectiveNote, None] = {}
    if plan is not None:
        for own_path in own:
            notes.update(dict.fromkeys(collective_note(row) for row in touching(plan, own_path)))
    return Placement(side.label, " | ".join(specs) or "?", tuple(notes))


def placements(check: TensorCheck, sides: Sequence[SideRun], plans: Sequence[Plan | None]) -> tuple[Placement, ...]:
    """The tensor's placement on every side."""
    return tuple(placement(side, check.tensor, plan) for side, plan in zip(sides, plans, strict=True))
