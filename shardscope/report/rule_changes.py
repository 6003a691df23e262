"""Words for a diff's rule changes (each with the collective changes it explains) and the compiler's
choices, shared by the terminal, Markdown and HTML renderers."""

from __future__ import annotations

from dataclasses import dataclass

from shardscope.diff.causes import traffic_delta
from shardscope.diff.changes import MESH, Change, PlanDiff, RuleChange
from shardscope.diff.kinds import ChangeKind
from shardscope.plan.units import signed_bytes

__all__ = ["ExplainedGroup", "explained_groups"]

_MARKS = {ChangeKind.COLLECTIVE_REMOVED: "−", ChangeKind.COLLECTIVE_ADDED: "+", ChangeKind.COLLECTIVE_CHANGED: "~"}
_TENSORS_SHOWN = 3


@dataclass(frozen=True)
class ExplainedGroup:
    """One block of the "why the collectives changed" section.

    Attributes:
      title: "`embed_moe`: fsdp → replicated", or "compiler's choices (no rule change explains them)".
      traffic: "−576.0 KiB per device per step".
      placed: "on params/decoder/…/wi_0, params/…/wi_1 and 2 more" ("" for the compiler's choices).
      rows: (mark, subject, traffic delta) of each collective change, in diff order.
      is_rule: a rule change (False: the compiler's choices).
    """

    title: str
    logical: str  # the logical axis of a rule change ("" for the compiler's choices or the mesh)
    move: str  # "fsdp → replicated" ("" likewise)
    traffic: str
    placed: str
    rows: tuple[tuple[str, str, str], ...]
    is_rule: bool


def _rows(subjects: tuple[str, ...], by_subject: dict[str, Change]) -> tuple[tuple[str, str, str], ...]:
    out = []
    for subject in subjects:
        change = by_subject.get(subject)
        if change is None:
            continue
        delta = traffic_delta(change)
        out.append((_MARKS.get(change.kind, "~"), subject, signed_bytes(delta)))
    return tuple(out)


def _placed(rule: RuleChange) -> str:
    if not rule.tensors:
        return ""
    shown = " · ".join(rule.tensors[:_TENSORS_SHOWN])
    more = len(rule.tensors) - _TENSORS_SHOWN
    return f"on {shown}" + (f" and {more} more" if more > 0 else "")


def explained_groups(diff: PlanDiff) -> tuple[ExplainedGroup, ...]:
    """The rule changes, largest traffic move first, then the compiler's choices; () when no collective
    changed."""
    by_subject = {c.subject: c for c in diff.changes if c.kind in _MARKS}
    groups = [
        ExplainedGroup(
            title=rule.title,
            logical=rule.logical if rule.logical != MESH else "",
            move=rule.move,
            traffic=f"{signed_bytes(rule.traffic_delta)} per device per step",
            placed=_placed(rule),
            rows=_rows(rule.collectives, by_subject),
            is_rule=True,
        )
        for rule in diff.rule_changes
    ]
    if diff.compilers_choices:
        delta = sum(traffic_delta(by_subject[s]) for s in diff.compilers_choices)
        groups.append(
            ExplainedGroup(
                title="compiler's choices (no rule change explains them)",
                logical="",
                move="",
                traffic=f"{signed_bytes(delta)} per device per step",
                placed="",
                rows=_rows(diff.compilers_choices, by_subject),
                is_rule=False,
            )
        )
    return tuple(groups)
