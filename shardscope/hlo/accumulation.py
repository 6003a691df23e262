"""Reductions a loop accumulates: an all-reduce in a loop body each of whose results is only added into a
buffer the loop carries, whole (a loss summed over vocabulary tiles) or into a slot of it the loop indexes (a
pipeline's weight gradient, summed over the data-parallel devices at every iteration and added into the slot
of the layer the iteration visited).

Where such a sum is taken decides what a TPU step does, and XLA's CPU compiler, which keeps every one in its
loop, does not say. Read from the TPU compiles at hand:
- Seed 003's pipelines (MaxText's programs and ours): the partitioner's sums of the visit gradients (Auto
  axes) are moved out of the loop: each iteration adds its partial sum into its slot inside the matmul that
  makes it, and the slots are reduced once after the loop. Those the program asks for itself (Explicit axes:
  MaxText marks the visited weights' gradients `reduced`) stay: reduced in the loop, in float32, each sum
  added into its slot on its own (69.8 GB a step per MLP matrix of Llama 2 7B, as counted).
- Llama 3.1's vocabulary-tiled loss (Auto axes): its sums into whole carried values stay in the loop.
So `slotted` holds the slot accumulations only; which of them a TPU moves depends on who asks for the sum,
which the caller knows (the case's axis types).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shardscope.hlo.executions import Program
from shardscope.hlo.loops import loop_bodies
from shardscope.hlo.records import Instruction, parameter_index, tuple_index, users_of
from shardscope.hlo.shapes import hbm_bytes

__all__ = ["Accumulations", "loop_accumulations"]

# Ops an all-reduce's result may pass through before it is added: views and conversions of it.
_PASSING = frozenset({"get-tuple-element", "bitcast", "convert", "copy", "reshape"})
_VIEWS = frozenset({"bitcast", "reshape"})
WHOLE, SLOT = "whole", "slot"


@dataclass(frozen=True)
class Accumulations:
    """One program's loop-accumulated reductions, each op by "computation/instruction"."""

    reductions: frozenset[str] = frozenset()  # the all-reduces
    adds: frozenset[str] = frozenset()  # the ops that add their results into the carried buffers
    # The reductions each of whose results is added into a slot (what a TPU moves out of an Auto program's
    # loop), with the ops that add them, and the bytes of the buffers they add into (what it then sums once).
    slotted: frozenset[str] = frozenset()
    slot_adds: frozenset[str] = frozenset()
    buffer_bytes: Mapping[str, int] = field(default_factory=dict)


def _carried_element(instruction: Instruction, parameter: str) -> int | None:
    """The loop state element a value is (a `get-tuple-element` of the body's parameter), or None."""
    return tuple_index(instruction) if instruction.operands[:1] == (parameter,) else None


def _accumulator(
    program: Program,
    value: str,
    users: Mapping[str, Sequence[Instruction]],
    by_name: Mapping[str, Instruction],
    parameter: str,
    root: Instruction,
) -> tuple[Instruction, str] | None:
    """The fusion that adds `value` into a carried buffer and hands the buffer back at its own element of the
    loop state (seen through views and conversions), and how (`WHOLE` or `SLOT`); None when `value` has
    another use."""
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
    for position, how in _accumulated_parameters(program, found).items():
        operand = by_name.get(found.operands[position]) if position < len(found.operands) else None
        if operand is not None and _carried_element(operand, parameter) in returned:
            return found, how
    return None


def _accumulated_parameters(program: Program, fusion: Instruction) -> dict[int, str]:
    """The fusion's parameters it adds into and returns, and how: its result is `p + x` (`WHOLE`), or `p`
    with `p[s] + x` written at slice `s` (`SLOT`: a dynamic-update-slice of p whose update adds a
    dynamic-slice of p), seen through views."""
    inner = program.fused(fusion)
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
        return {}
    if result.opcode == "add":
        return {p: WHOLE for p in (parameter_of(o) for o in result.operands) if p is not None}
    update = seen(result.operands[1])
    if result.opcode != "dynamic-update-slice" or update is None or update.opcode != "add":
        return {}
    buffer = parameter_of(result.operands[0])
    sliced = {parameter_of(o, through_slice=True) for o in update.operands}
    return {buffer: SLOT} if buffer is not None and buffer in sliced else {}


def loop_accumulations(program: Program) -> Accumulations:
    """Every loop body's all-reduces whose every result is accumulated into a carried buffer (module doc)."""
    reductions: set[str] = set()
    adds: set[str] = set()
    slotted: set[str] = set()
    slot_adds: set[str] = set()
    buffers: dict[str, int] = {}
    for body in sorted(loop_bodies(program.module)):
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
            accumulators = [f for f in found if f is not None]
            if not found or len(accumulators) < len(found):
                continue
            key = f"{body}/{instruction.name}"
            names = {f"{body}/{fusion.name}" for fusion, _ in accumulators}
            reductions.add(key)
            adds.update(names)
            if all(how == SLOT for _, how in accumulators):
                slotted.add(key)
                slot_adds.update(names)
                buffers[key] = sum(hbm_bytes(fusion.shape) for fusion, _ in accumulators)
    return Accumulations(frozenset(reductions), frozenset(adds), frozenset(slotted), frozenset(slot_adds), buffers)
