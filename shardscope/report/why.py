"""`why`'s answer in words: for each collective, the chain from rule to tensor spec to the op that needs it
to the collective, with its bytes and estimated time."""

from __future__ import annotations

from collections.abc import Sequence

from shardscope.plan.document import Plan
from shardscope.plan.estimate import Estimate
from shardscope.plan.frames import spec_axes_text
from shardscope.plan.records import CollectiveRow, axes_label, rule_text
from shardscope.plan.units import human_bytes, human_seconds
from shardscope.plan.why import WhyRow
from shardscope.report.estimate_text import route_label

__all__ = ["row_headline", "why_lines"]

_MOVES_SHOWN = 3


def row_headline(row: CollectiveRow, seconds: float | None, estimate: Estimate | None) -> str:
    """ "all-gather over fsdp, backward: 32.0 KiB × 8 = 256.0 KiB per device per step, ≈ 0.1 ms (…)"."""
    runs = "?" if row.loop_trips is None else str(row.count * row.loop_trips)
    text = f"{row.op} over {axes_label(row)}, {row.pass_}: {human_bytes(row.bytes)} × {runs}"
    text += f" = {human_bytes(row.traffic)} per device per step"
    if row.tpu_moved_out is not None:  # the loop only accumulates it: the time is the TPU's one sum
        text += f"; on TPU summed once, after the loop ({human_bytes(row.tpu_moved_out)})"
    if seconds is not None and estimate is not None:
        text += f", ≈ {human_seconds(seconds)} ({route_label(estimate)})"
    return text


def why_lines(plan: Plan, rows: Sequence[WhyRow], limit: int | None = None) -> list[str]:
    """The answer, a block per row (at most `limit` rows, the rest counted in a last line)."""
    tensors = dict(plan.tensors)
    lines: list[str] = []
    shown = rows if limit is None else rows[:limit]
    for answer in shown:
        row, cause = answer.row, answer.row.cause
        lines.append(row_headline(row, answer.seconds, plan.estimate))
        if cause is None:
            lines += ["  (no cause recorded for this row)", ""]
            continue
        if cause.compilers_choice:
            lines.append(
                f"  rule       none: the compiler's choice (no rule puts a dimension of what it moves, or of what"
                f" that is computed from, on {axes_label(row)})"
            )
        for rule in cause.rules:
            record = tensors.get(rule.tensor)
            spec = f" sharded {spec_axes_text(record.spec)}" if record is not None else ""
            lines.append(f"  rule       {rule_text(rule)} (rule {rule.rule} of {plan.case.preset})")
            lines.append(f"    on       {rule.tensor}{spec}")
        moved = " · ".join(cause.tensors[:_MOVES_SHOWN]) or "?"
        more = len(cause.tensors) - _MOVES_SHOWN
        lines.append(f"  moves      {moved}" + (f" and {more} more (combined by the compiler)" if more > 0 else ""))
        where = f" at {cause.line}" if cause.line else ""
        lines.append(f"  needed by  {cause.consumer}{where}")
        lines.append("")
    if limit is not None and len(rows) > limit:
        lines.append(f"… {len(rows) - limit} more rows match (use --all to see them)")
    return lines
