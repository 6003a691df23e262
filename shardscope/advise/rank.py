"""Compiled candidates in order: fastest estimated step first, among those that fit in HBM.

The key is the expected step (`Estimate.expected`: per-op compute, collectives overlapped per loop body),
then the step with nothing overlapped, then the HBM need, then the candidate's place in enumeration order:
equal estimates keep a fixed order, so the ranking never depends on which compile finished first. Each
row says why it wins or loses: the winner its largest collective (axis and op); every other row the
collective that costs it most against the winner. Presets that compile to the same program on the same
mesh (the same collectives, memory and work) are one row, which names them all: those `advise.programs`
grouped before compiling share their representative's plan, and so its program digest; any others are
found here, by the digests of their own plans.
"""

from __future__ import annotations

import hashlib
import math
import shlex
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from shardscope.advise.space import Candidate
from shardscope.plan.document import Plan
from shardscope.plan.estimate import Estimate
from shardscope.plan.records import axes_label
from shardscope.plan.units import human_bytes, human_seconds

if TYPE_CHECKING:
    from shardscope.advise.advice import Advice

COMPILED = "compiled"
PREDICTED = "predicted"


@dataclass(frozen=True)
class Ranked:
    """One compiled candidate with its estimate's figures (seconds and bytes per device per step)."""

    candidate: Candidate
    step_expected: float  # the estimate's expected step (its no-overlap bound where it has none)
    step_no_overlap: float
    step_full_overlap: float
    communication: float
    compute: float
    compute_bound: str  # "flops" or "memory": what limits the compute roofline
    hbm_need: int
    hbm_capacity: int
    hbm_exact: bool  # the TPU compiler's figure (else estimated from the tensors)
    by_collective: tuple[tuple[str, str, float], ...]  # (axes, op, seconds), most expensive first
    command: str  # the `shardscope dump` that reproduces the plan
    rank: int = 0  # 1 = best; 0: does not fit
    reason: str = ""
    program: str = ""  # a digest of the compiled program's collectives, memory and work on this mesh
    same_program: tuple[str, ...] = ()  # other presets that compiled to this program (folded into this row)
    source: str = COMPILED  # COMPILED: the figures are a compiled plan's; PREDICTED: a prediction's (no compile)
    predicted_step: float | None = None  # the prediction's expected step, beside a compiled one

    @property
    def fits(self) -> bool:
        return self.hbm_need <= self.hbm_capacity

    @property
    def dominant(self) -> tuple[str, str, float] | None:
        """The collective (axes, op) that costs most time, or None when it has none."""
        return self.by_collective[0] if self.by_collective else None

    def sort_key(self) -> tuple[float, float, int, int]:
        """Expected step first; the no-overlap bound breaks ties, then HBM, then search order."""
        return (self.step_expected, self.step_no_overlap, self.hbm_need, self.candidate.index)


def collective_times(plan: Plan, estimate: Estimate) -> tuple[tuple[str, str, float], ...]:
    """Seconds per step of each (mesh axes, op) pair, cross-slice traffic included, most expensive first."""
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for row, time in zip(plan.collectives, estimate.rows, strict=True):
        if time.seconds is not None:
            totals[(axes_label(row), row.op)] += time.seconds
    for priced in estimate.cross_slice:
        if priced.time.seconds is not None:
            totals[(axes_label(priced.row), priced.row.op)] += priced.time.seconds
    return tuple(sorted(((a, o, s) for (a, o), s in totals.items()), key=lambda t: (-t[2], t[0], t[1])))


def ranked_of(candidate: Candidate, plan: Plan, command: Sequence[str]) -> Ranked:
    """A priced plan's figures (the plan must carry its estimate)."""
    estimate = plan.estimate
    if estimate is None:
        raise ValueError(f"{candidate.key}: plan is not priced")
    return Ranked(
        candidate=candidate,
        step_expected=estimate.step_no_overlap if estimate.expected is None else estimate.expected,
        step_no_overlap=estimate.step_no_overlap,
        step_full_overlap=estimate.step_full_overlap,
        communication=estimate.communication,
        compute=estimate.compute.seconds,
        compute_bound=estimate.compute.bound,
        hbm_need=estimate.memory.total,
        hbm_capacity=estimate.memory.capacity,
        hbm_exact=estimate.memory.exact,
        by_collective=collective_times(plan, estimate),
        command=shlex.join(command),
        program=program_digest(plan),
    )


def program_digest(plan: Plan) -> str:
    """What two presets share when they compile to the same program on the same mesh."""
    text = repr((plan.case.mesh, plan.collectives, plan.memory, plan.compute))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _fold_same_programs(entries: Sequence[Ranked]) -> list[Ranked]:
    """One row per program (the first in order), naming the other presets that compiled to it."""
    kept: dict[str, Ranked] = {}
    for entry in entries:
        first = kept.get(entry.program)
        if first is None or not entry.program:
            kept[entry.program or f"#{entry.candidate.index}"] = entry
            continue
        kept[entry.program] = replace(first, same_program=(*first.same_program, entry.candidate.preset_label))
    return list(kept.values())


def rank(entries: Sequence[Ranked]) -> tuple[tuple[Ranked, ...], tuple[Ranked, ...]]:
    """(the candidates that fit, best first, numbered and explained; those that do not, least over first)."""

    fitting = _fold_same_programs(sorted((e for e in entries if e.fits), key=Ranked.sort_key))
    over = sorted((e for e in entries if not e.fits), key=lambda e: (e.hbm_need - e.hbm_capacity, e.sort_key()))
    best = fitting[0] if fitting else None
    ranked = tuple(replace(e, rank=i + 1, reason=_reason(e, best)) for i, e in enumerate(fitting))
    return ranked, tuple(replace(e, reason=_over_reason(e)) for e in over)


def _seconds(value: float) -> str:

    return human_seconds(value)


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "0%"


def _same(a: float, b: float) -> bool:
    """Equal up to float rounding: the same program under two presets sums its times in another order."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def _reason(entry: Ranked, best: Ranked | None) -> str:
    dominant = entry.dominant
    if best is None or entry is best or entry.sort_key() == best.sort_key():
        if dominant is None:
            return "best: no collective at all; compute only"
        axes, op, seconds = dominant
        share = _share(seconds, entry.step_expected)
        return f"best: largest collective {op} over {axes}, {_seconds(seconds)} ({share} of its step)"
    slower = entry.step_expected - best.step_expected
    theirs = {(a, o): s for a, o, s in best.by_collective}
    worst = max(
        ((a, o, s - theirs.get((a, o), 0.0)) for a, o, s in entry.by_collective),
        key=lambda t: (t[2], t[0], t[1]),
        default=None,
    )
    ahead = f"+{_seconds(slower)} ({_share(slower, best.step_expected)}) over #1"
    if _same(entry.step_expected, best.step_expected):
        behind = entry.step_no_overlap - best.step_no_overlap
        if not _same(entry.step_no_overlap, best.step_no_overlap):
            return f"ties #1 expected; {_seconds(behind)} slower with nothing overlapped"
        if entry.hbm_need > best.hbm_need:
            return f"ties #1 in time; needs {human_bytes(entry.hbm_need - best.hbm_need)} more HBM"
        return "same estimate as #1 (listed after it in search order)"
    if worst is None or worst[2] <= 0:
        compute = entry.compute - best.compute
        return f"{ahead}: compute {'+' if compute >= 0 else ''}{_seconds(compute)}"
    axes, op, extra = worst
    return f"{ahead}: {op} over {axes} costs {_seconds(extra)} more"


def _over_reason(entry: Ranked) -> str:

    what = "" if entry.hbm_exact else " (estimated)"
    return f"does not fit: needs {human_bytes(entry.hbm_need)}{what} of {human_bytes(entry.hbm_capacity)} HBM"


def compiled_candidates(advice: Advice) -> tuple[Ranked, ...]:
    """Every priced candidate of a search (compiled, or predicted only): the ranking, then those over HBM."""
    return (*advice.ranking, *advice.over_capacity)


def rank_confirmed(
    compiled: Sequence[Ranked], predicted_only: Sequence[Ranked]
) -> tuple[tuple[Ranked, ...], tuple[Ranked, ...]]:
    """The ranking of a search that compiled some candidates: the compiled ones first (their figures are
    the compiler's), then those only predicted, each group in its own order; rank numbers run on."""
    ranked, over = rank(compiled)
    rest, rest_over = rank(predicted_only)
    best = ranked[0] if ranked else None
    shifted = tuple(
        replace(e, rank=len(ranked) + e.rank, reason=_predicted_reason(e, best) if best else e.reason) for e in rest
    )
    return (*ranked, *shifted), (*over, *rest_over)


def _predicted_reason(entry: Ranked, best: Ranked) -> str:
    """Why a candidate that was only predicted stays below the compiled ones: its prediction against #1's
    (predictions compare with predictions; a compiled figure would mix in the prediction's error)."""
    if best.predicted_step is None:
        return "predicted only (not compiled)"
    gap = entry.step_expected - best.predicted_step
    share = _share(abs(gap), best.predicted_step)
    return f"predicted {'+' if gap >= 0 else '-'}{_seconds(abs(gap))} ({share}) against #1's prediction (not compiled)"
