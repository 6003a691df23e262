"""How many times a `while` loop runs: what the compiler wrote, else what its condition and init say.

The CPU compiler records it (`backend_config={"known_trip_count":{"n":"16"}}`); the TPU compiler does not,
so the count is derived as a person would: the condition compares one element of the loop state (an
induction variable, reached through get-tuple-element, copies, converts, fusions and calls) with a constant;
the while's init tuple gives that element's start; the body's root tuple gives its step. Anything else
(a bound that is not constant, a start computed at run time) is unknown: None, never a guess of 1.
"""

from __future__ import annotations

import re
from typing import Any

from shardscope.hlo.module import InstructionTable
from shardscope.hlo.records import Instruction, Module, tuple_index

__all__ = ["LoopTrips"]

_TRIP_RE = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_INT_RE = re.compile(r"-?\d+")
_PASS_THROUGH = frozenset({"copy", "bitcast", "convert", "reshape"})
_FLIP = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE", "EQ": "EQ", "NE": "NE"}
_MAX_DEPTH = 32  # operand chains followed through fusions; deeper ones count as unknown

# A value as (loop-state index or None, coefficient, offset) = coef * state[index] + offset; or a compare
# as ("compare", direction, lhs, rhs); or None when it is neither.
Form = Any


class LoopTrips:
    """Trip counts of a module's loops; instruction tables are read once per computation and kept."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self._tables: dict[str, InstructionTable] = {}

    def table(self, name: str) -> InstructionTable:
        """Every instruction of a computation, read on demand."""
        if name not in self._tables:
            self._tables[name] = InstructionTable(self.module, name)
        return self._tables[name]

    def trips(self, computation: str, loop: Instruction) -> int | None:
        """Iterations of the `while` instruction `loop` of `computation`, or None if unknown."""
        known = _TRIP_RE.search(loop.attribute("backend_config") or "")
        if known:
            return int(known.group(1))
        condition, body = loop.attribute("condition"), loop.attribute("body")
        if condition is None or body is None or not loop.operands:
            return None
        return self._derive(computation, loop.operands[0], condition.lstrip("%"), body.lstrip("%"))

    def _affine(self, comp: str, name: str, env: list[Form] | None, depth: int = 0) -> Form:
        """The affine form of a value (see `Form`); fusions and calls are entered with their parameters bound."""
        table = self.table(comp)
        instruction = table.get(name)
        if instruction is None or depth > _MAX_DEPTH:
            return None
        opcode, args = instruction.opcode, instruction.operands
        if opcode == "constant":
            return (None, 0, int(args[0])) if args and _INT_RE.fullmatch(args[0]) else None
        if opcode == "parameter":
            k = int(args[0]) if args and args[0].isdigit() else -1
            return env[k] if env is not None and 0 <= k < len(env) else None
        if opcode == "get-tuple-element" and env is None and args:
            source = table.get(args[0])
            index = tuple_index(instruction)
            return (index, 1, 0) if source and source.opcode == "parameter" and index is not None else None
        if opcode in _PASS_THROUGH and args:
            return self._affine(comp, args[0], env, depth + 1)
        if opcode in ("fusion", "call"):
            callees = instruction.callees()
            if not callees:
                return None
            sub = callees[0][1]
            bound = [self._affine(comp, a, env, depth + 1) for a in args]
            return self._affine(sub, self.table(sub).root, bound, depth + 1)
        if len(args) < 2:
            return None
        lhs, rhs = (self._affine(comp, a, env, depth + 1) for a in args[:2])
        if opcode == "compare":
            return ("compare", instruction.attribute("direction") or "", lhs, rhs)
        if opcode not in ("add", "subtract") or not _is_form(lhs) or not _is_form(rhs):
            return None
        if lhs[0] is not None and rhs[0] is not None and lhs[0] != rhs[0]:
            return None
        sign = 1 if opcode == "add" else -1
        return (lhs[0] if lhs[0] is not None else rhs[0], lhs[1] + sign * rhs[1], lhs[2] + sign * rhs[2])

    def _derive(self, comp: str, init: str, condition: str, body: str) -> int | None:
        """Trip count from `state[i] <dir> N` in the condition, the init tuple's constant and the body's step."""
        cond = self._affine(condition, self.table(condition).root, None)
        if not cond or cond[0] != "compare" or not _is_form(cond[2]) or not _is_form(cond[3]):
            return None
        _, direction, lhs, rhs = cond
        index = lhs[0] if lhs[0] is not None else rhs[0]
        coef, bound = lhs[1] - rhs[1], rhs[2] - lhs[2]
        if coef < 0:
            coef, bound, direction = -coef, -bound, _FLIP.get(direction, "")
        if index is None or coef != 1 or (lhs[0] is not None and rhs[0] is not None):
            return None
        table = self.table(comp)
        tuple_ = table.get(init)
        for _ in range(_MAX_DEPTH):
            if tuple_ is None or tuple_.opcode not in _PASS_THROUGH or not tuple_.operands:
                break
            tuple_ = table.get(tuple_.operands[0])
        if tuple_ is None or tuple_.opcode != "tuple" or index >= len(tuple_.operands):
            return None
        start = self._affine(comp, tuple_.operands[index], None)
        if start is None or start[0] is not None:
            return None
        body_table = self.table(body)
        root = body_table.get(body_table.root)
        step = None
        if root is not None and root.opcode == "tuple" and index < len(root.operands):
            update = self._affine(body, root.operands[index], None)
            step = update[2] if update and update[0] == index and update[1] == 1 else None
        # jax loops count up (or down) by one; assume that when the body's update is opaque.
        return _trip_count(start[2], bound, step or (-1 if direction in ("GT", "GE") else 1), direction)


def _is_form(value: Form) -> bool:
    return value is not None and not isinstance(value[0], str)


def _trip_count(start: int, bound: int, step: int, direction: str) -> int | None:
    """Iterations of `for (i = start; i <direction> bound; i += step)`."""
    if step > 0 and direction in ("LT", "LE"):
        return max(0, -(-(bound - start) // step) if direction == "LT" else (bound - start) // step + 1)
    if step < 0 and direction in ("GT", "GE"):
        return max(0, -(-(start - bound) // -step) if direction == "GT" else (start - bound) // -step + 1)
    if direction == "NE" and (bound - start) % step == 0 and (bound - start) // step >= 0:
        return (bound - start) // step
    return None
