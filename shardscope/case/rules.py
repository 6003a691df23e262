"""Logical → physical axis resolution with Flax's rule semantics, and the explanation of each decision.

Flax (`flax.linen.logical_to_mesh_axes`) tries rules in order; a rule `(logical, mesh_axes)` applies to the
dimension named `logical` only if that dimension is still unassigned and none of `mesh_axes` is already
used by another dimension. A rule with no mesh axes still *assigns* (to "replicated"), so it shadows every
later rule for that name. This module reimplements those semantics without JAX so that `explain` is
symbolic and so that every skipped rule can be reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# One rule: a logical axis name and the mesh axes it shards over (empty = replicated).
Rule = tuple[str, tuple[str, ...]]
# A normalised spec entry: None (replicated), one mesh axis, or several.
SpecEntry = str | tuple[str, ...] | None
Spec = tuple[SpecEntry, ...]


@dataclass(frozen=True)
class RuleSkip:
    """A rule that named this dimension but did not apply, and why."""

    rule_index: int
    mesh_axes: tuple[str, ...]
    reason: str
    decided_by: int | None = None  # the earlier rule that had already decided the dimension
    taken_axis: str | None = None  # the mesh axis another dimension had already taken


@dataclass(frozen=True)
class DimDecision:
    """How one dimension of a logical-axes tuple got its physical spec."""

    logical: str | None
    spec: SpecEntry
    rule_index: int | None  # the rule that decided it; None = no rule matched (replicated)
    mesh_axes: tuple[str, ...]
    skipped: tuple[RuleSkip, ...]


def normalize_entry(mesh_axes: Sequence[str] | str | None) -> SpecEntry:
    """One spec entry in the plan's normal form: None, "axis" or ("a", "b")."""
    if mesh_axes is None:
        return None
    if isinstance(mesh_axes, str):
        return mesh_axes
    axes = tuple(mesh_axes)
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def entry_axes(entry: SpecEntry) -> tuple[str, ...]:
    """The mesh axes of a normalised spec entry, as a tuple."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def explain_logical(logical: Sequence[str | None], rules: Sequence[Rule]) -> tuple[DimDecision, ...]:
    """Resolves a logical-axes tuple and records, per dimension, which rule decided it.

    Args:
      logical: one logical axis name (or None) per dimension.
      rules: the preset's rules, in priority order.

    Returns:
      One DimDecision per dimension.

    Raises:
      ValueError: a logical name occurs twice (Flax rejects that too).
    """
    names = [n for n in logical if n is not None]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"logical axis names {dups} occur more than once in {tuple(logical)}")
    assigned: list[tuple[str, ...] | None] = [None] * len(logical)
    deciding: list[int | None] = [None] * len(logical)
    skipped: list[list[RuleSkip]] = [[] for _ in logical]
    for index, (rule_logical, rule_axes) in enumerate(rules):
        if rule_logical not in names:
            continue
        pos = list(logical).index(rule_logical)
        if assigned[pos] is not None:
            reason = f"dimension already assigned by rule {deciding[pos]}"
            skipped[pos].append(RuleSkip(index, rule_axes, reason, decided_by=deciding[pos]))
            continue
        used = {axis: dim for dim, axes in enumerate(assigned) if axes for axis in axes}
        clash = [axis for axis in rule_axes if axis in used]
        if clash:
            reason = f"mesh axis {clash[0]!r} already used by dimension {used[clash[0]]}"
            skipped[pos].append(RuleSkip(index, rule_axes, reason, taken_axis=clash[0]))
            continue
        assigned[pos] = rule_axes
        deciding[pos] = index
    return tuple(
        DimDecision(
            logical=name,
            spec=normalize_entry(assigned[dim]),
            rule_index=deciding[dim],
            mesh_axes=assigned[dim] or (),
            skipped=tuple(skipped[dim]),
        )
        for dim, name in enumerate(logical)
    )


def resolve_logical(logical: Sequence[str | None], rules: Sequence[Rule]) -> Spec:
    """The normalised physical spec of a logical-axes tuple (Flax semantics)."""
    return tuple(decision.spec for decision in explain_logical(logical, rules))


def shard_shape(shape: Sequence[int], spec: Spec, mesh_sizes: dict[str, int]) -> tuple[int, ...]:
    """Per-device shape of a tensor (ceil division, as XLA pads uneven shards)."""
    result = []
    for size, entry in zip(shape, spec, strict=True):
        ways = 1
        for axis in entry_axes(entry):
            ways *= mesh_sizes[axis]
        result.append(-(-size // ways))
    return tuple(result)


def indivisible_dims(
    shape: Sequence[int], spec: Spec, mesh_sizes: dict[str, int]
) -> list[tuple[int, int, tuple[str, ...], int]]:
    """Dimensions whose size the product of their mesh axes does not divide: (dim, size, axes, ways)."""
    bad = []
    for dim, (size, entry) in enumerate(zip(shape, spec, strict=True)):
        axes = entry_axes(entry)
        ways = 1
        for axis in axes:
            ways *= mesh_sizes[axis]
        if size % ways:
            bad.append((dim, size, axes, ways))
    return bad


@dataclass(frozen=True)
class Indivisible:
    """A tensor whose spec its mesh axes do not divide, found by a lenient trace (which replicates those
    dimensions and goes on, so that every such tensor is found, not only the first)."""

    path: str
    shape: tuple[int, ...]
    spec: Spec
    dims: tuple[tuple[int, int, tuple[str, ...], int], ...]  # (dim, size, mesh axes, shards)


def drop_unit_axes(spec: Spec, mesh_sizes: dict[str, int]) -> Spec:
    """The spec without mesh axes of size 1: they shard nothing, so the physical spec leaves them out.

    This is what makes two plans on meshes that differ only in size-1 axes (a preset that names
    `fsdp_transpose` or `context` without using them) compare equal, and what lets a layer scan run over a
    dimension a size-1 `stage` axis would otherwise "shard" under Explicit axes.
    """
    return tuple(normalize_entry([a for a in entry_axes(entry) if mesh_sizes.get(a, 1) != 1]) for entry in spec)
