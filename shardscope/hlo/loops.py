"""Where a compiled step's loops put its ops: which loop body each computation runs in, and the loops XLA's
CPU compiler writes for a scatter (`shardscope.hlo.profile` counts such a loop as the one scatter a TPU runs).
"""

from __future__ import annotations

from collections.abc import Mapping

from shardscope.hlo.executions import Program
from shardscope.hlo.metadata import op_name_in, split_outside_brackets
from shardscope.hlo.records import Module
from shardscope.hlo.shapes import shape_info

__all__ = ["expanded_scatters", "loop_bodies", "loop_regions"]


def loop_bodies(module: Module) -> set[str]:
    """The computations some `while` of the module runs as its body."""
    return {
        callee
        for comp in module.computations
        for instruction in comp.instructions
        if instruction.opcode == "while"
        for attribute, callee in instruction.callees()
        if attribute == "body"
    }


def expanded_scatters(program: Program, runs: Mapping[str, int | None]) -> tuple[dict[str, int], set[str]]:
    """XLA's CPU compiler expands a scatter (an embedding's gradient) into a loop over its updates, each
    trip rewriting the whole operand; a TPU scatters natively. Returns each such loop's bytes as one
    scatter (indices and updates read, the rows they touch read and written: three times the updates,
    plus the indices) by the loop's instruction name, and the computations the loops run (left out)."""
    loops: dict[str, int] = {}
    inside: set[str] = set()
    for name in runs:
        for instruction in program.instructions(name):
            if (
                instruction.opcode != "while"
                or "scatter" not in op_name_in(instruction.attribute("metadata")).rsplit("/", 1)[-1]
            ):
                continue
            elements = sorted(shape_info(e)[2] for e in split_outside_brackets(instruction.shape.strip()[1:-1], ","))
            # The loop carries (counter, operand, indices, updates): all but the counter and the operand.
            loops[f"{name}/{instruction.name}"] = 3 * sum(elements[1:-1])
            pending = [callee for _, callee in instruction.callees()]
            while pending:
                callee = pending.pop()
                if callee not in inside:
                    inside.add(callee)
                    pending += [c for i in program.instructions(callee) for _, c in i.callees()]
    return loops, inside


def loop_regions(program: Program, runs: Mapping[str, int | None]) -> dict[str, int]:
    """Each computation's outermost enclosing loop body's executions per step (1 outside loops)."""
    entry = program.module.entry
    if entry is None:
        return {}
    region = {entry: 1}
    pending = [entry]
    while pending:
        name = pending.pop()
        for callee, per_call in program.calls(name):
            if callee in region:
                continue
            loop = per_call is None or per_call > 1
            region[callee] = (runs.get(callee) or 0) if loop and region[name] == 1 else region[name]
            pending.append(callee)
    return region
