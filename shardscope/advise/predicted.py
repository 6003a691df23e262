"""Every screened candidate priced by prediction, and the few a search compiles to confirm it.

A compile takes seconds to minutes; a prediction (`shardscope.predict`: the collectives and the work a
compile would give, from the placement alone) takes milliseconds, so a search predicts every candidate and
compiles only the best `confirm` of them, plus any other whose predicted step is within `margin` of the
best's: the prediction's error against the compiler (`benchmarks/prediction.py`) could reorder those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from shardscope.advise.prune import Target
from shardscope.advise.rank import PREDICTED, Ranked, ranked_of
from shardscope.advise.space import Candidate
from shardscope.advise.template import Template, placed_plan
from shardscope.case.resolve import Case
from shardscope.cost.price import price_plan
from shardscope.errors import ShardscopeError
from shardscope.plan.document import Plan
from shardscope.plan.records import case_record
from shardscope.predict import predicted_plan


def predicted_entry(plan: Plan, candidate: Candidate, command: Sequence[str]) -> Ranked:
    """A predicted plan's figures as a ranking row, marked predicted."""
    entry = ranked_of(candidate, plan, command)
    return dataclasses.replace(entry, source=PREDICTED, program="", predicted_step=entry.step_expected)


def to_confirm(entries: Sequence[Ranked], confirm: int, margin: float) -> frozenset[int]:
    """The candidates (indexes) to compile: the `confirm` best predicted that fit, and every other that fits
    within `margin` of the best; where none is predicted to fit, the `confirm` least over capacity (the
    prediction's memory is the tensors' estimate, not the compiler's)."""
    fitting = sorted((e for e in entries if e.fits), key=Ranked.sort_key)
    if not fitting:
        over = sorted(entries, key=lambda e: (e.hbm_need - e.hbm_capacity, e.sort_key()))
        return frozenset(e.candidate.index for e in over[:confirm])
    bound = fitting[0].step_expected * (1 + margin)
    chosen = fitting[:confirm] + [e for e in fitting[confirm:] if e.step_expected <= bound]
    return frozenset(e.candidate.index for e in chosen)


def safe_prediction(template: Template, case: Case, target: Target) -> Plan | str:
    """The candidate's predicted plan (its case as screening resolved it), priced on the target, or the
    one-line reason it could not be priced."""
    # Placed with the activations even under a pipeline: the work model reads their per-device shapes
    # (attention, the MoE's tokens) and scales them to a microbatch itself.
    try:
        placed = template.place(case.mesh, pipelined=False)
        plan = predicted_plan(placed_plan(case_record(case), placed), case=case, causes=False)
        return price_plan(plan, target.hardware_name, target.efficiency)
    except ShardscopeError as err:
        return str(err)
