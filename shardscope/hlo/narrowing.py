"""Which float32 values of a CPU program have bfloat16 precision: the bytes a TPU moves and touches.

XLA's CPU compiler runs a bfloat16 program's arithmetic in float32 (its float normalisation): a weight is
all-gathered in float32 and rounded to bfloat16 by its consumer, a gradient computed in bfloat16 is
widened before it is summed. The TPU compiler moves such values in bfloat16 (it moves the conversion to
the other side of the collective), so pricing a CPU program as a TPU needs the bytes in bfloat16. A value
has bfloat16 precision when it comes straight from a conversion out of a 16-bit float, or when every
consumer rounds it to a 16-bit float before anything else (both seen through bitcasts, copies, reshapes
and transposes, and into fusions). A sum is the exception: the sum of values of bfloat16 precision has
float32 precision, so a widened value summed by an all-reduce or reduce-scatter narrows only when every
consumer rounds the sum (the float normalisation of a bfloat16 sum); one the program keeps in float32 (an
Explicit pipeline's gradient summed at every iteration into a float32 accumulator) the TPU sums in float32
too. The work profile reads a CPU program's ops the same way: each op's
float32 operands and result of bfloat16 precision at two bytes an element (`half_operands`,
`half_result`), as the TPU holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shardscope.hlo.executions import computation_instructions
from shardscope.hlo.metadata import split_outside_brackets
from shardscope.hlo.records import Instruction, Module, base_opcode, parameter_index, tuple_index, users_of
from shardscope.hlo.shapes import shape_info

__all__ = ["Narrowing"]

_VIEWS = frozenset({"bitcast", "copy", "reshape", "transpose"})
# Collectives that sum their operands: the sum of values of bfloat16 precision has float32 precision.
_SUMS = frozenset({"all-reduce", "reduce-scatter"})
_HALF = ("bf16[", "f16[")


def _is_half(shape: str) -> bool:
    return shape.strip().startswith(_HALF)


def _elements(shape: str) -> list[str]:
    text = shape.strip()
    return split_outside_brackets(text[1:-1], ",") if text.startswith("(") else [text]


class _Table:
    """One computation's instructions by name, and each one's users."""

    def __init__(self, instructions: Sequence[Instruction]) -> None:
        self.by_name = {i.name: i for i in instructions}
        self.users = users_of(instructions)
        self.root = next((i for i in instructions if i.is_root), instructions[-1] if instructions else None)
        self.parameters = {parameter_index(i): i for i in instructions if i.opcode == "parameter"}


class Narrowing:
    """Answers, per collective instruction of a module, the bytes its result would take in bfloat16 where
    its values have bfloat16 precision, and per op which of its float32 operands and results have it
    (tables are read once per computation; `instructions`: a reader of a computation's instructions to
    share, e.g. `Program.instructions`)."""

    def __init__(self, module: Module, instructions: Callable[[str], Sequence[Instruction]] | None = None) -> None:
        self.module = module
        self._instructions = instructions or (lambda computation: computation_instructions(module, computation))
        self._tables: dict[str, _Table] = {}

    def _table(self, computation: str) -> _Table:
        if computation not in self._tables:
            self._tables[computation] = _Table(self._instructions(computation))
        return self._tables[computation]

    def half_operands(self, computation: str, instruction: Instruction) -> frozenset[int]:
        """Positions of an op's float32 operands of bfloat16 precision: made by a conversion out of a 16-bit
        float, or rounded to one by the op before anything else (a fusion's parameter, a conversion)."""
        table = self._table(computation)
        fused = self._fused_table(instruction) if instruction.opcode == "fusion" else None
        rounded_here = instruction.opcode == "convert" and _is_half(instruction.shape)
        found = set()
        for position, operand in enumerate(instruction.operands):
            producer = table.by_name.get(operand)
            if producer is None or not producer.shape.strip().startswith("f32["):
                continue
            if rounded_here or self._rounds_parameter(fused, position) or self._comes_from_half(table, operand):
                found.add(position)
        return frozenset(found)

    def half_result(self, computation: str, instruction: Instruction) -> bool:
        """Whether an op's float32 result has bfloat16 precision (made from a 16-bit float, or rounded to one
        by every user)."""
        if not instruction.shape.strip().startswith("f32["):
            return False
        table = self._table(computation)
        return self._comes_from_half(table, instruction.name) or self._rounds(table, instruction.name)

    def tpu_bytes(self, computation: str, collective: Instruction) -> int | None:
        """The collective's result bytes with every float32 element of bfloat16 precision counted at 2 bytes
        an element; None when nothing narrows (or the collective is asynchronous: its values are read
        through its `-done`)."""
        if collective.opcode.endswith("-start"):
            return None
        table = self._table(computation)
        elements = _elements(collective.shape)
        total = narrowed = 0
        for index, element in enumerate(elements):
            size = shape_info(element)[2]
            total += size
            if not element.strip().startswith("f32["):
                continue
            operand = collective.operands[index] if index < len(collective.operands) else None
            if len(elements) > 1:
                consumers = [u for u in table.users.get(collective.name, []) if tuple_index(u) == index]
                half_use = bool(consumers) and all(self._rounds(table, u.name) for u in consumers)
            else:
                half_use = self._rounds(table, collective.name)
            # A value widened before a sum keeps its width through it: the program asked for a float32 sum.
            sums = base_opcode(collective.opcode) in _SUMS
            if half_use or (not sums and operand is not None and self._comes_from_half(table, operand)):
                narrowed += size // 2
        return total - narrowed if narrowed else None

    def _rounds_parameter(self, fused: _Table | None, position: int) -> bool:
        """Whether a fusion's fused code rounds its operand at `position` to a 16-bit float first."""
        if fused is None or (parameter := fused.parameters.get(position)) is None:
            return False
        return self._rounds(fused, parameter.name)

    def _comes_from_half(self, table: _Table, name: str) -> bool:
        producer = table.by_name.get(name)
        while producer is not None and producer.opcode in _VIEWS and producer.operands:
            producer = table.by_name.get(producer.operands[0])
        if producer is None:
            return False
        if producer.opcode == "convert":
            source = table.by_name.get(producer.operands[0]) if producer.operands else None
            return source is not None and _is_half(source.shape)
        if producer.opcode == "fusion":
            fused = self._fused_table(producer)
            return fused is not None and fused.root is not None and self._comes_from_half(fused, fused.root.name)
        return False

    def _rounds(self, table: _Table, name: str) -> bool:
        """Whether every use of `name` rounds it to a 16-bit float first."""
        users = table.users.get(name, [])
        if not users:
            return False
        for user in users:
            if user.opcode in _VIEWS:
                if not self._rounds(table, user.name):
                    return False
            elif user.opcode == "convert":
                if not _is_half(user.shape):
                    return False
            elif user.opcode == "fusion":
                fused = self._fused_table(user)
                if fused is None:
                    return False
                for position, operand in enumerate(user.operands):
                    parameter = fused.parameters.get(position)
                    if operand == name and (parameter is None or not self._rounds(fused, parameter.name)):
                        return False
            else:
                return False
        return True

    def _fused_table(self, fusion: Instruction) -> _Table | None:
        called = [callee for attribute, callee in fusion.callees() if attribute == "calls"]
        return self._table(called[0]) if called else None
