"""The call graph walked from the entry: how many times each collective instruction runs, and in how many
loop iterations.

A computation called from two sites runs twice; a `while` body runs trip-count times and its condition
once more; every branch of a conditional counts, as if it always ran; an async wrapper (`async-start …
calls=`) is one call (its `-done` names the same computation again and is no call). The walk is an
explicit stack, so call chains thousands deep cost nothing more; a computation that calls itself (invalid
HLO) contributes nothing to itself.

When the text ends before the entry (a truncated file), every computation that no read computation calls
is walked as a root, with unknown loop trips: what calls it was not read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from shardscope.hlo.records import Call, Computation, Module
from shardscope.hlo.trips import LoopTrips

__all__ = ["expand_calls"]

# (index of a collective instruction, loop trips or None) -> instances
Counts = Counter[tuple[int, int | None]]
_NOTHING: Counts = Counter()


def _multiplier(
    comp: Computation, call: Call, trips: LoopTrips, loops: dict[tuple[str, str], int | None]
) -> int | None:
    """1 for a plain call; the trip count for a loop body, one more for its condition; None if unknown."""
    if call.opcode != "while" or call.attribute not in ("body", "condition"):
        return 1
    key = (comp.name, call.site)
    if key not in loops:
        loop = next((i for i in comp.instructions if i.name == call.site and i.opcode == "while"), None)
        loops[key] = trips.trips(comp.name, loop) if loop is not None else None
    n = loops[key]
    return None if n is None else n + (call.attribute == "condition")


def expand_calls(module: Module, collectives: Mapping[str, list[int]], trips: LoopTrips) -> Counts:
    """Instances of every collective under the module's roots, by (collective index, loop trips).

    Args:
      module: the read module.
      collectives: computation name -> indices of the collective instructions in it.
      trips: loop trip counts of the module.
    """
    by_name = module.by_name
    memo: dict[str, Counts] = {}
    loops: dict[tuple[str, str], int | None] = {}

    def combine(comp: Computation) -> Counts:
        out: Counts = Counter((r, 1) for r in collectives.get(comp.name, ()))
        for call in comp.calls:
            below = memo.get(call.callee, _NOTHING)
            if not below:
                continue
            mult = _multiplier(comp, call, trips, loops)
            for (r, n_trips), n in below.items():
                out[(r, None if n_trips is None or mult is None else n_trips * mult)] += n
        return out

    def walk(root: str) -> Counts:
        if root in memo or root not in by_name:
            return memo.get(root, _NOTHING)
        stack: list[tuple[Computation, int]] = [(by_name[root], 0)]
        active = {root}
        while stack:
            comp, k = stack[-1]
            if k < len(comp.calls):
                stack[-1] = (comp, k + 1)
                callee = comp.calls[k].callee
                if callee not in memo and callee not in active and callee in by_name:
                    active.add(callee)
                    stack.append((by_name[callee], 0))
                continue
            stack.pop()
            active.discard(comp.name)
            memo[comp.name] = combine(comp)
        return memo[root]

    total: Counts = Counter()
    if module.entry is not None:
        total.update(walk(module.entry))
    if module.truncation is not None:
        called = {call.callee for comp in module.computations for call in comp.calls}
        for comp in module.computations:
            if comp.name not in called and comp.name != module.entry:
                for (r, _), n in walk(comp.name).items():
                    total[(r, None)] += n
    return total
