"""Both sides of a diff priced on one target, so that their times compare."""

from __future__ import annotations

from shardscope.cost.price import price_plan
from shardscope.diff.networks import platform_of
from shardscope.errors import ShardscopeError
from shardscope.plan.document import Plan
from shardscope.plan.estimate import Estimate


def price_pair(
    old: Plan, new: Plan, hardware: str | None = None, efficiency: float | None = None
) -> tuple[Estimate | None, Estimate | None, list[str]]:
    """Both plans priced on one target, so their times compare: `hardware` if named, else the generation
    either plan was priced on (the new one first), else each TPU plan's own topology.

    Raises:
      ShardscopeError: a named `hardware` the plans cannot be priced on (unknown, or a mesh that is no
        slice of it). Without one, a side that cannot be priced is left out with a note.
    """
    if hardware is None and {platform_of(old), platform_of(new)} == {"tpu", "gpu"}:
        # A TPU plan against a GPU plan: no target prices both (a TPU generation has no NVLink, a GPU no
        # torus), so each is priced on its own hardware, as its own dump prints it.
        return _own(old, efficiency), _own(new, efficiency), []
    chosen = hardware
    if chosen is None:
        priced = [plan.estimate for plan in (new, old) if plan.estimate is not None]
        if priced:
            chosen = priced[0].hardware
            if efficiency is None and priced[0].efficiency_source == "caller":
                efficiency = priced[0].efficiency
    sides: list[Estimate | None] = []
    notes: list[str] = []
    for name, plan in (("old", old), ("new", new)):
        try:
            sides.append(price_plan(plan, chosen, efficiency).estimate)
        except ShardscopeError as err:
            if hardware is not None:
                raise
            sides.append(None)
            notes.append(f"the {name} plan is not priced: {err}")
    if chosen is None and (sides[0] is None) != (sides[1] is None):
        # One TPU plan and one CPU plan: price the CPU side as the TPU side's generation.
        target = (sides[0] or sides[1]).hardware  # type: ignore[union-attr]
        return price_pair(old, new, target, efficiency)
    return sides[0], sides[1], notes


def _own(plan: Plan, efficiency: float | None) -> Estimate | None:
    """A plan priced on its own topology's hardware (a GPU plan: the figures of its GPUs)."""
    return price_plan(plan, None, None if platform_of(plan) == "gpu" else efficiency).estimate
