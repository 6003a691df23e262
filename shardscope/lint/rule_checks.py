"""Lints of the rule file against the model: dead and shadowed rules (and, summarised, the rules other model
families use), rules naming size-1 or absent mesh axes, and logical names the model uses that no rule mentions."""

from __future__ import annotations

import difflib
import functools
from collections import defaultdict
from collections.abc import Iterator

from shardscope.case.presets import get_preset
from shardscope.case.rules import RuleSkip, explain_logical
from shardscope.lint.context import LintContext, LogicalAxes, axes_text, rule_subject
from shardscope.lint.family_names import FAMILY_NAMES
from shardscope.lint.unsized_mesh import on_unsized_defaults
from shardscope.plan.findings import Finding

# Every logical name some model family uses (from the checked-in table: tracing them at lint time is slow).
_FAMILY_USED = frozenset(name for names in FAMILY_NAMES.values() for name in names)
# MaxText's shared rules (base.yml, the built-in `default` preset) name what MaxText's other models use too
# (attention variants, pipeline stages, ...): a rule for one of those names serves a model shardscope does
# not ship, not a misspelling.
MAXTEXT_MODELS = "MaxText's other models"


@functools.cache
def _maxtext_names() -> frozenset[str]:
    return frozenset(name for name, _ in get_preset("default").logical_axis_rules) - _FAMILY_USED


def _shared(name: str) -> bool:
    return name in _FAMILY_USED or name in _maxtext_names()


def _example(tuples: list[LogicalAxes]) -> str:
    return "(" + ", ".join(str(name) for name in sorted(tuples, key=repr)[0]) + ")"


def dead_rule_indices(ctx: LintContext) -> set[int]:
    """Positions of the rules whose logical name the model never uses."""
    return {index for index, (logical, _) in enumerate(ctx.rules) if logical not in ctx.used_names}


def families_using(name: str) -> tuple[str, ...]:
    """The model families whose models use a logical name, in table order (or MaxText's other models, whose
    shared rules name it)."""
    families = tuple(family for family, names in FAMILY_NAMES.items() if name in names)
    return families or ((MAXTEXT_MODELS,) if name in _maxtext_names() else ())


def other_model_rule_indices(ctx: LintContext) -> set[int]:
    """Positions of the dead rules whose logical name another model family uses: a shared file's, not a typo."""
    return {index for index in dead_rule_indices(ctx) if _shared(ctx.rules[index][0])}


def _unused_anywhere(ctx: LintContext) -> list[str]:
    """The rules' logical names neither this model nor any model family uses (the likely misspellings)."""
    return sorted(name for name in {logical for logical, _ in ctx.rules} - ctx.used_names if not _shared(name))


def check_dead_rules(ctx: LintContext) -> Iterator[Finding]:
    """`dead-rule`: rules whose logical name no tensor carries, the model never resolves and no other model
    family uses (those are `rules-for-other-models`)."""
    ruled = {logical for logical, _ in ctx.rules}
    unruled = sorted(ctx.used_names - ruled)
    for index in sorted(dead_rule_indices(ctx) - other_model_rule_indices(ctx)):
        logical = ctx.rules[index][0]
        # Renaming only ever goes towards a name this model uses; names other models use never get here.
        close = difflib.get_close_matches(logical, unruled, n=1)
        hint = f"; did you mean {close[0]!r} (a name the model uses that no rule mentions)?" if close else ""
        yield Finding(
            "dead-rule",
            "warning",
            rule_subject(index, ctx.rules[index]),
            f"no tensor of {ctx.plan.case.model} carries {logical!r}, the model never resolves it and no model "
            f"family uses it: the rule shards nothing{hint}",
            f"rename it to {close[0]!r}"
            if close
            else f"delete the rule, or keep it only if the file serves models "
            f"that use {logical!r} (then silence with lint: {{ignore: [dead-rule]}})",
        )


def _silenced_as_dead(ctx: LintContext, subject: str) -> bool:
    """Whether the preset silences one rule's `dead-rule` finding by its subject: the summary must not bring
    that rule back (silencing dead-rule wholly silences the summary too: `run.silenced`)."""
    return any(lint == "dead-rule" and text in subject for lint, text in ctx.preset.lint.ignore_subjects)


def check_rules_for_other_models(ctx: LintContext) -> Iterator[Finding]:
    """`rules-for-other-models`: one summary of the dead rules whose logical name another model family uses."""
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for index in sorted(other_model_rule_indices(ctx)):
        logical = ctx.rules[index][0]
        if not _silenced_as_dead(ctx, rule_subject(index, ctx.rules[index])):
            groups[families_using(logical)].append(f"[{index}] {logical}")
    if not groups:
        return
    count = sum(len(rules) for rules in groups.values())
    used_by = "; ".join(f"{', '.join(families)}: {', '.join(rules)}" for families, rules in sorted(groups.items()))
    yield Finding(
        "rules-for-other-models",
        "info",
        "rules for other model families",
        f"{count} {'rule names a logical name' if count == 1 else 'rules name logical names'} "
        f"{ctx.plan.case.model} does not use but models of these families do, so here they shard nothing: "
        f"{used_by}",
        "nothing to fix: the file serves several model families (lint it with their models to check these rules)",
    )


def _outcomes_by_rule(ctx: LintContext) -> dict[int, list[tuple[LogicalAxes, RuleSkip | None]]]:
    """Rule position → (tuple, outcome) for every used tuple naming the rule's logical name; the outcome is
    None where the rule decided the dimension, else why it was skipped."""
    outcomes: dict[int, list[tuple[LogicalAxes, RuleSkip | None]]] = defaultdict(list)
    for axes in sorted(ctx.used, key=repr):
        for decision in explain_logical(axes, ctx.rules):
            if decision.logical is None:
                continue
            if decision.rule_index is not None:
                outcomes[decision.rule_index].append((axes, None))
            for skip in decision.skipped:
                outcomes[skip.rule_index].append((axes, skip))
    return outcomes


def effective_rule_indices(ctx: LintContext) -> set[int]:
    """Positions of the rules that decide at least one dimension of a tuple the model uses."""
    return {index for index, seen in _outcomes_by_rule(ctx).items() if any(o is None for _, o in seen)}


def check_shadowed_rules(ctx: LintContext) -> Iterator[Finding]:
    """`shadowed-rule`: rules for a used name that decide no dimension of anything the model places."""
    dead = dead_rule_indices(ctx)
    outcomes = _outcomes_by_rule(ctx)
    for index, (logical, _) in enumerate(ctx.rules):
        if index in dead:
            continue
        seen = outcomes.get(index, [])
        if any(outcome is None for _, outcome in seen):
            continue
        earlier = sorted({o.decided_by for _, o in seen if o is not None and o.decided_by is not None})
        taken = sorted({o.taken_axis for _, o in seen if o is not None and o.taken_axis is not None})
        reasons = []
        if earlier:
            rules = ", ".join(rule_subject(i, ctx.rules[i]).removeprefix("logical_axis_rules") for i in earlier)
            reasons.append(f"an earlier rule for {logical!r} decides first ({rules})")
        if taken:
            reasons.append(f"its mesh axes ({', '.join(taken)}) are taken by other dimensions")
        tuples = [t for t, _ in seen]
        yield Finding(
            "shadowed-rule",
            "warning",
            rule_subject(index, ctx.rules[index]),
            f"never decides a dimension: in all {len(set(tuples))} logical-axes tuples naming {logical!r} "
            f"(e.g. {_example(tuples)}), " + " or ".join(reasons),
            "delete the rule, or move it above the rule that shadows it if it should win",
        )


def check_absent_axes(ctx: LintContext) -> Iterator[Finding]:
    """`absent-axis-rule`: rules (not dead or shadowed) naming mesh axes that `mesh_axes` lacks."""
    effective = effective_rule_indices(ctx)
    for index, (logical, axes) in enumerate(ctx.rules):
        absent = [axis for axis in axes if axis not in ctx.preset.mesh_axes]
        if not absent or index not in effective:
            continue
        yield Finding(
            "absent-axis-rule",
            "warning",
            rule_subject(index, ctx.rules[index]),
            f"names {', '.join(map(repr, absent))}, which mesh_axes {list(ctx.preset.mesh_axes)} lacks: size 1 on "
            f"every mesh (as MaxText treats it), so {logical!r} is never sharded over it",
            f"add {absent[0]!r} to mesh_axes, or drop it from the rule",
        )


def check_unit_axes(ctx: LintContext) -> Iterator[Finding]:
    """`unit-axis-rule`: effective rules naming mesh axes (of `mesh_axes`) that are size 1 on this mesh."""
    if on_unsized_defaults(ctx.preset, ctx.plan.case.mesh):
        return  # a file without mesh sizes: `dump` and `lint` say in one line which axes are idle, and how to size
    effective = effective_rule_indices(ctx)
    for index, (logical, axes) in enumerate(ctx.rules):
        idle = [axis for axis in axes if axis in ctx.preset.mesh_axes and ctx.size(axis) == 1]
        if not idle or index not in effective:
            continue
        real = [axis for axis in axes if ctx.size(axis) > 1]
        effect = f"shards {logical!r} over {axes_text(tuple(real))} only" if real else f"replicates {logical!r}"
        yield Finding(
            "unit-axis-rule",
            "info",
            rule_subject(index, ctx.rules[index]),
            f"names {', '.join(idle)}, of size 1 on this mesh ({len(idle)} of {len(axes)} axes): here the rule "
            f"{effect}",
            "nothing to fix if the file serves meshes where these axes are larger; else drop them from the rule",
        )


def check_unmatched_names(ctx: LintContext) -> Iterator[Finding]:
    """`unmatched-name`: logical names the model uses that no rule mentions (replicated by omission)."""
    ruled = sorted({logical for logical, _ in ctx.rules})
    # A rule is only "meant for" this name if no model uses its own name: never suggest renaming a shared name.
    misspelt = _unused_anywhere(ctx)
    carriers: dict[str, list[str]] = defaultdict(list)
    for path, tensor in ctx.tensors_of("param", "input", "activation"):
        for name in tensor.logical or ():
            if name is not None:
                carriers[name].append(path)
    for name in sorted(ctx.used_names - set(ruled)):
        close = difflib.get_close_matches(name, misspelt, n=1)
        hint = f"; the rule for {close[0]!r} may be meant for it" if close else ""
        paths = sorted(carriers.get(name, []), key=lambda p: (not p.startswith("params/"), p))
        where = f"{len(paths)} parameters, inputs or activations (e.g. {paths[0]})" if paths else ""
        where = where or "a placement the model resolves without recording a tensor"
        yield Finding(
            "unmatched-name",
            "info",
            f"logical name {name!r}",
            f"no rule mentions {name!r}, used by {where}: replicated{hint}",
            f"add [{name}, []] to state the replication, or a rule that shards it",
        )
