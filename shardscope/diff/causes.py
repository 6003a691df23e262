"""Diffs that explain themselves: each collective change linked to the rule change that caused it.

A collective row's cause names the rules that put the moved (or summed) dimensions on its mesh axes and the
tensor each rule placed (`shardscope.extract.causes`). A collective that appears, disappears or changes is
explained by a rule change when a tensor its cause names on either side has that rule's dimension placed
differently in the two plans (a spec change of the diff): the change of that logical axis's placement is
the rule change. Collective changes no such spec change explains are the compiler's choices (or, when the
mesh changed, the mesh's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardscope.case.rules import entry_axes
from shardscope.diff.changes import MESH, Change, CollectiveSide, RuleChange
from shardscope.diff.kinds import COLLECTIVE_CHANGE_KINDS
from shardscope.plan.records import Cause, RuleCause

__all__ = ["explain_collective_changes", "merged_cause", "side_traffic", "traffic_delta"]


def merged_cause(causes: Sequence[Cause | None]) -> Cause | None:
    """The causes of the rows of one collective key as one (tensors and rules of all of them, in order)."""
    present = [c for c in causes if c is not None]
    if not present:
        return None
    rules: dict[tuple[int, str], RuleCause] = {}
    for cause in present:
        for rule in cause.rules:
            rules.setdefault((rule.rule, rule.tensor), rule)
    return Cause(
        tensors=tuple(dict.fromkeys(t for c in present for t in c.tensors)),
        consumer=present[0].consumer,
        line=present[0].line,
        rules=tuple(rules.values()),
    )


def side_traffic(side: CollectiveSide | None) -> int:
    """The traffic of one side of a collective change (0 where the collective is absent or unpriced)."""
    return 0 if side is None or side.traffic is None else side.traffic


def traffic_delta(change: Change) -> int:
    """Bytes per device per step a collective change adds (negative: removes)."""
    before, after = change.collective_sides
    return side_traffic(after) - side_traffic(before)


def _module_of(path: str) -> str:
    """The module of an activation path (`activations/decoder/mlp/x` → `decoder/mlp`); "" for others."""
    if not path.startswith("activations/"):
        return ""
    return path.removeprefix("activations/").rsplit("/", 1)[0] if "/" in path.removeprefix("activations/") else ""


def _row_axes(change: Change) -> set[str]:
    return {axis for side in change.collective_sides if side is not None for axis in side.axes or ()}


def _fallback(
    change: Change, dims: Mapping[str, Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]]
) -> tuple[tuple[str, tuple[str, ...], tuple[str, ...]], str] | None:
    """When no rule of the cause moved: a moved dimension, onto or off the collective's axes, of a tensor the
    cause names (a gradient's parameter included) or of an activation of the collective's module (or of the
    nearest enclosing module whose activations moved)."""
    axes = _row_axes(change)

    def touching(path: str) -> tuple[str, tuple[str, ...], tuple[str, ...]] | None:
        for logical, (before, after) in sorted(dims.get(path, {}).items()):
            if axes & (set(before) ^ set(after)):
                return (logical, before, after)
        return None

    named = [
        t.removeprefix("grads/")
        for side in change.collective_sides
        if side is not None and side.cause is not None
        for t in side.cause.tensors
    ]
    for path in dict.fromkeys(named):
        key = touching(path)
        if key is not None:
            return key, path
    module = change.collective.source
    parts = module.split("/") if module else []
    while True:
        prefix = "/".join(parts)
        for path in sorted(p for p in dims if p.startswith("activations/") and _module_of(p) == prefix):
            key = touching(path)
            if key is not None:
                return key, path
        if not parts:
            break
        parts.pop()
    for path in sorted(p for p in dims if p.startswith("activations/")):  # outside every module: any activation
        key = touching(path)
        if key is not None:
            return key, path
    return None


def explain_collective_changes(
    changes: Sequence[Change], mesh_changed: bool
) -> tuple[tuple[RuleChange, ...], tuple[str, ...]]:
    """The rule changes that explain the collective changes among `changes`, largest traffic move first, and
    the subjects of the collective changes none explains."""
    moved: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {}
    for change in changes:
        for dim in change.dims:
            if dim.logical is not None:
                moved.setdefault(change.subject, {})[dim.logical] = (entry_axes(dim.before), entry_axes(dim.after))
    groups: dict[tuple[str, tuple[str, ...], tuple[str, ...]], dict[str, Any]] = {}
    placed: dict[tuple[Any, ...], tuple[str, tuple[str, ...], tuple[str, ...]]] = {}
    unexplained: list[Change] = []
    for change in changes:
        if change.kind not in COLLECTIVE_CHANGE_KINDS:
            continue
        keys: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[str]] = {}
        for side in change.collective_sides:
            for rule in side.cause.rules if side is not None and side.cause is not None else ():
                placement = moved.get(rule.tensor, {}).get(rule.logical)
                if placement is not None:
                    keys.setdefault((rule.logical, *placement), []).append(rule.tensor)
        if not keys:
            found = _fallback(change, moved)
            if found is not None:
                keys[found[0]] = [found[1]]
        if not keys and mesh_changed:
            keys[(MESH, (), ())] = []
        if not keys:
            unexplained.append(change)
            continue
        # One group a change (the rule its cause names first), so the groups' traffic adds up to the diff's.
        key, tensors = next(iter(keys.items()))
        _join(groups, key, change, tensors)
        placed[_identity(change)] = key
    compilers: list[str] = []
    for change in unexplained:
        # A collective the compiler combines (one all-reduce of many gradients) is removed in one shape and
        # added in another when a rule changes what it combines: the counterpart's rule change explains it.
        counterpart = placed.get(_identity(change))
        if counterpart is None:
            compilers.append(change.subject)
        else:
            _join(groups, counterpart, change, [])
    found_groups = [
        RuleChange(logical, before, after, tuple(g["tensors"]), tuple(g["collectives"]), g["delta"])
        for (logical, before, after), g in groups.items()
    ]
    found_groups.sort(key=lambda r: (-abs(r.traffic_delta), r.logical, r.before, r.after))
    return tuple(found_groups), tuple(compilers)


def _identity(change: Change) -> tuple[Any, ...]:
    """A collective change's identity but for its shape: op, mesh axes, pass and module."""
    side = change.collective
    return (side.op, side.axes, side.pass_, side.source)


def _join(
    groups: dict[tuple[str, tuple[str, ...], tuple[str, ...]], dict[str, Any]],
    key: tuple[str, tuple[str, ...], tuple[str, ...]],
    change: Change,
    tensors: Sequence[str],
) -> None:
    group = groups.setdefault(key, {"tensors": [], "collectives": [], "delta": 0})
    group["tensors"] += [t for t in dict.fromkeys(tensors) if t not in group["tensors"]]
    group["collectives"].append(change.subject)
    group["delta"] += traffic_delta(change)
