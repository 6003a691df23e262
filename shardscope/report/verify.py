"""A verification's report in words: what ran against what, each step's loss on both sides, and either the
tensor that came closest to its tolerance or the divergences in the order the step computes them."""

from __future__ import annotations

from shardscope.verify.records import Divergence, VerifyReport

__all__ = ["verify_lines"]

# Divergences shown in full; the JSON report holds them all.
SHOWN = 5
# Collectives listed under a side of a divergence.
COLLECTIVES_SHOWN = 4


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _divergence_lines(divergence: Divergence) -> list[str]:
    check = divergence.check
    lines = [
        f"  step {check.step}  {check.tensor}  ({check.kind}, {check.dtype}{_shape(check.shape)})",
        f"    max abs error {check.max_abs_error:.3g}, max rel error {check.max_rel_error:.3g}; allowed "
        f"{check.tolerance:.3g} where it is furthest over ({check.ratio:.3g}×)",
    ]
    for placement in divergence.placements:
        lines.append(f"    {placement.side}: {placement.spec}")
        for note in placement.collectives[:COLLECTIVES_SHOWN]:
            where = f" at {note.line}" if note.line else ""
            lines.append(f"      {note.op} over {note.axes}, {note.pass_}, for {note.consumer}{where}")
        hidden = len(placement.collectives) - COLLECTIVES_SHOWN
        if hidden > 0:
            lines.append(f"      and {hidden} more collective{'s' if hidden > 1 else ''} (--json lists them)")
    return lines


def verify_lines(report: VerifyReport, shown: int = SHOWN) -> list[str]:
    """The report as terminal lines."""
    steps = f"{report.steps} step{'s' if report.steps != 1 else ''}"
    lines = [f"verify {report.subject}: {report.side} against {report.against}, {steps} on {report.topology}"]
    for loss in report.losses:
        lines.append(
            f"  step {loss.step}  loss {loss.loss:.8g} against {loss.reference:.8g} "
            f"(difference {abs(loss.loss - loss.reference):.2g})"
        )
    if report.same:
        text = f"same: all {report.checked} tensor checks within their tolerances"
        closest = report.closest
        if closest is not None:
            text += f" (closest: {closest.tensor} at step {closest.step}, {closest.ratio:.2g} of its tolerance)"
        return [*lines, text]
    count = len(report.divergences)
    lines.append(
        f"diverged: {count} of {report.checked} tensor checks over their tolerances, from step "
        f"{report.divergences[0].check.step}; in the order the step computes them:"
    )
    for divergence in report.divergences[:shown]:
        lines += _divergence_lines(divergence)
    if count > shown:
        lines.append(f"  and {count - shown} more (--json lists them all)")
    return lines
