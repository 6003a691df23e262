"""Reductions a loop accumulates: an all-reduce in a loop body each of whose results is only added into a
slice of a buffer the loop carries (a pipeline's weight gradient, summed over the data-parallel devices at
every iteration and added into the slot of the layer the iteration visited).

Where such a sum is taken decides what a TPU step does. XLA's TPU compiler moves an all-reduce that is only
accumulated out of its loop (its while-loop all-reduce code motion): each iteration adds its partial sum into
the buffer inside the matmul that makes it, and the buffer is reduced once after the loop. In seed 003's
pipelines compiled for TPU (MaxText's programs and ours) it does so for the reductions the partitioner
makes (Auto axes) and keeps those of Explicit axes, which the program itself asks for at every iteration
(MaxText marks the visited weights' gradients `reduced`): those programs reduce in the loop, in float32,
and add each sum into its slot on its own (69.8 GB a step per MLP matrix of Llama 2 7B, as counted). XLA's
CPU compiler keeps both kinds in the loop, so a CPU program is read here for which it holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shardscope.hlo.executions import Program
from shardscope.hlo.records import Instruction, parameter_index, users_of
from shardscope.hlo.shapes import hbm_bytes

__all__ = ["Accumulations", "loop_accumulations"]

# Ops an all-reduce's result may pass through before it is added: views and conversions of it.
_PASSING = frozenset({"get-tuple-element", "bitcast", "convert", "copy", "reshape"})
_VIEWS = frozenset({"bitcast", "reshape"})


@dataclass(frozen=True)
class Accumulations:
    """One program's loop-accumulated reductions, each op by "computation/instruction"."""

    reductions: frozenset[str] = frozenset()  # the all-reduces
    adds: frozenset[str] = frozenset()  # the ops that add their results into the carried buffers
    # Per reduction, the bytes of the buffers it is accumulated into (what it sums once when moved out).
    buffer_bytes: Mapping[str, int] = field(default_factory=dict)


def _loop_bodies(program: Program) -> set[str]:
    return {
        callee
        for comp in program.module.computations
        for instruction in comp.instructions
        if instruction.opcode == "while"
        for attribute, callee in instruction.callees()
        if attribute == "body"
    }


def _carried_element(instruction: Instruction, parameter: str, by_name: Mapping[str, Instruction]) -> int | None:
    """The loop state element a value is (a `get-tuple-element` of the body's parameter), or None."""
    if instruction.opcode != "get-tuple-element" or not instruction.operands or instruction.operands[0] != parameter:
        return None
    index = instruction.attribute("index")
    return int(index) if index is not None and index.isdigit() else None


def _accumulator(
    program: Program,
    value: str,
    users: Mapping[str, Sequence[Instruction]],
    by_name: Mapping[str, Instruction],
    parameter: str,
    root: Instruction,
) -> Instruction | None:
    """The op that adds `value` into a slice of a carried buffer and hands the buffer back at its own element
    of the loop state, seen through views and conversions; None when `value` has another use."""
    pending, found = [value], None
    while pending:
        for user in users.get(pending.pop(), ()):
            if user.opcode in _PASSING:
                pending.append(user.name)
                continue
            if found is not None or user.opcode != "fusion":
                return None
            found = user
    if found is None:
        return None
    returned = {k for k, operand in enumerate(root.operands) if operand == found.name}
    into = _accumulated_parameters(program, found)
    carried = {_carried_element(by_name[o], parameter, by_name) for j, o in enumerate(found.operands) if j in into}
    return found if returned & carried else None


def _accumulated_parameters(program: Program, fusion: Instruction) -> set[int]:
    """The fusion's parameters it adds into and returns: its result is `p + x`, or `p` with `p[s] + x` written
    at slice `s` (a dynamic-update-slice of p whose update adds a dynamic-slice of p), seen through views."""
    called = [callee for attribute, callee in fusion.callees() if attribute == "calls"]
    inner = program.instructions(called[0]) if called else ()
    by_name = {i.name: i for i in inner}

    def seen(name: str) -> Instruction | None:
        instruction = by_name.get(name)
        while instruction is not None and instruction.opcode in _VIEWS and instruction.operands:
            instruction = by_name.get(instruction.operands[0])
        return instruction

    def parameter_of(name: str, through_slice: bool = False) -> int | None:
        instruction = seen(name)
        if through_slice and instruction is not None and instruction.opcode == "dynamic-slice":
            instruction = seen(instruction.operands[0])
        return parameter_index(instruction) if instruction is not None and instruction.opcode == "parameter" else None

    root = next((i for i in inner if i.is_root), None)
    result = seen(root.name) if root is not None else None
    if result is None or len(result.operands) < 2:
        return set()
    if result.opcode == "add":
        return {p for p in (parameter_of(o) for o in result.operands) if p is not None}
    update = seen(result.operands[1])
    if result.opcode != "dynamic-update-slice" or update is None or update.opcode != "add":
        return set()
    buffer = parameter_of(result.operands[0])
    sliced = {parameter_of(o, through_slice=True) for o in update.operands}
    return {buffer} if buffer is not None and buffer in sliced else set()


def loop_accumulations(program: Program) -> Accumulations:
    """Every loop body's all-reduces whose every result is accumulated into a carried buffer (module doc)."""
    reductions: set[str] = set()
    adds: set[str] = set()
    buffers: dict[str, int] = {}
    for body in sorted(_loop_bodies(program)):
        instructions = program.instructions(body)
        by_name = {i.name: i for i in instructions}
        root = next((i for i in instructions if i.is_root), None)
        parameter = next((i.name for i in instructions if i.opcode == "parameter"), None)
        if root is None or root.opcode != "tuple" or parameter is None:
            continue
        users = users_of(instructions)
        for instruction in instructions:
            if instruction.opcode != "all-reduce":
                continue
            results = [u.name for u in users.get(instruction.name, ())] if instruction.shape.startswith("(") else []
            if instruction.shape.startswith("(") and any(by_name[r].opcode != "get-tuple-element" for r in results):
                continue
            found = [_accumulator(program, r, users, by_name, parameter, root) for r in results or [instruction.name]]
            if not found or any(f is None for f in found):
                continue
            key = f"{body}/{instruction.name}"
            reductions.add(key)
            adds.update(f"{body}/{f.name}" for f in found if f is not None)
            buffers[key] = sum(hbm_bytes(f.shape) for f in found if f is not None)
    return Accumulations(frozenset(reductions), frozenset(adds), buffers)
