"""The checks of a verification made into its report: the losses, the tensor nearest its tolerance, and every
divergence placed on both sides (a preset side's plan is extracted only when something diverged)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shardscope.plan.document import Plan
from shardscope.verify.blame import placements
from shardscope.verify.records import Divergence, StepLoss, TensorCheck, VerifyReport
from shardscope.verify.run import SideRun
from shardscope.verify.tolerance import RULE

# A side's plan, made on demand (None: a side with no plan to name collectives from).
PlanOf = Callable[[SideRun], Plan | None]


def step_losses(side: SideRun, against: SideRun) -> tuple[StepLoss, ...]:
    """Each step's loss on both sides (none for a program without a `loss` output)."""
    if "loss" not in side.paths or "loss" not in against.paths:
        return ()
    mine, theirs = side.paths.index("loss"), against.paths.index("loss")
    return tuple(
        StepLoss(step + 1, float(values[mine]), float(reference[theirs]))
        for step, (values, reference) in enumerate(zip(side.values, against.values, strict=True))
    )


def build_report(
    subject: str, topology: str, side: SideRun, against: SideRun, checks: Sequence[TensorCheck], plan_of: PlanOf
) -> VerifyReport:
    """The report of a verification whose checks are in computation order."""
    diverged = [check for check in checks if check.diverged]
    passing = [check for check in checks if not check.diverged]
    closest = max(passing, key=lambda check: check.ratio, default=None)
    divergences: tuple[Divergence, ...] = ()
    if diverged:
        sides = (side, against)
        plans = [plan_of(run) for run in sides]
        divergences = tuple(_divergence(check, sides, plans) for check in diverged)
    return VerifyReport(
        subject=subject,
        side=side.label,
        against=against.label,
        topology=topology,
        steps=len(side.values),
        checked=len(checks),
        losses=step_losses(side, against),
        closest=closest,
        divergences=divergences,
        rule=RULE,
    )


def _divergence(check: TensorCheck, sides: Sequence[SideRun], plans: Sequence[Plan | None]) -> Divergence:
    placed = placements(check, sides, plans)
    lines = dict.fromkeys(note.line for place in placed for note in place.collectives if note.line)
    return Divergence(check, placed, tuple(lines))
