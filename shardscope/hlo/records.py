"""The records the HLO reader produces: instructions, calls, computations, the module.

Instructions, modules and what went wrong are frozen dataclasses. Calls and computations are immutable
named tuples: a 200 MB dump holds some 100,000 computations and as many calls, and a named tuple is built
several times faster than a frozen dataclass (the difference is a quarter of the reading time).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "CALL_ATTRIBUTES",
    "COLLECTIVE_LIKE",
    "COLLECTIVE_OPS",
    "Call",
    "Computation",
    "Instruction",
    "Malformed",
    "Module",
    "Truncation",
    "base_opcode",
    "matters",
]

# Attributes whose value names computations (calls of fusions, reducers, loops, branches, async wrappers).
CALL_ATTRIBUTES = frozenset(
    {"calls", "to_apply", "condition", "body", "true_computation", "false_computation", "branch_computations"}
    | {"called_computations", "select", "scatter"}
)
# Opcodes that move data between devices, or look as if they might (send, recv, a newer compiler's).
COLLECTIVE_LIKE = re.compile(r"all-|reduce-scatter|collective-|ragged-|send|recv")
ASYNC_ENDS = ("-done", "-update")
# The collectives the reader counts (an async pair's halves named after them: `all-gather-start`, …).
COLLECTIVE_OPS: tuple[str, ...] = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "ragged-all-to-all")
COLLECTIVE_OPS += ("collective-permute", "collective-broadcast")
_COMPUTATION_NAMES = re.compile(r"%?([A-Za-z_][A-Za-z0-9_.\-]*)")


@dataclass(frozen=True)
class Instruction:
    """One instruction, however many lines it spans.

    Attributes:
      name: its name, without `%`.
      opcode: e.g. "all-gather-start".
      shape: its result shape as written, comments removed, e.g. "(f32[8]{0}, s32[])".
      operands: each operand's name (its last word: `f32[8]{0} %x` gives "x", `constant(0)` gives "0").
      attributes: (name, value as written, comments removed) in text order;
        `replica_groups=mesh[…], device_ids=(…) {…}` is one attribute.
      offset: where it starts in the text.
      is_root: marked ROOT.
    """

    name: str
    opcode: str
    shape: str
    operands: tuple[str, ...]
    attributes: tuple[tuple[str, str], ...]
    offset: int
    is_root: bool = False

    def attribute(self, key: str) -> str | None:
        """The spelling of an attribute's value, or None if the instruction has none of that name."""
        return next((value for name, value in self.attributes if name == key), None)

    def callees(self) -> tuple[tuple[str, str], ...]:
        """(attribute, computation name) of every computation the instruction names (`{%a, %b}` gives two)."""
        return tuple(
            (key, name)
            for key, value in self.attributes
            if key in CALL_ATTRIBUTES
            for name in _COMPUTATION_NAMES.findall(value)
        )


def base_opcode(opcode: str) -> str:
    """The op an async half does: `all-gather-start` → `all-gather`; any other opcode as it is."""
    return opcode.rsplit("-", 1)[0] if opcode.endswith(("-start", *ASYNC_ENDS)) else opcode


def matters(instruction: Instruction) -> bool:
    """Kept in `Computation.instructions`: collectives, their async halves, collective-like opcodes, loops."""
    opcode = instruction.opcode
    return opcode == "while" or opcode.endswith(ASYNC_ENDS) or COLLECTIVE_LIKE.match(opcode) is not None


@dataclass(frozen=True)
class Malformed:
    """Text where an instruction should be that does not parse: its offset and the opcode it seems to have."""

    offset: int
    opcode: str | None


class Call(NamedTuple):
    """An edge of the call graph: instruction `site` (of `opcode`) names `callee` in `attribute`."""

    callee: str
    attribute: str
    site: str
    opcode: str


class Computation(NamedTuple):
    """One computation: where it is, the instructions in it that matter (see `matters`), and its calls.

    Calls to computations read earlier that hold no collective, loop or call (most fusions) are left out:
    they add nothing to any count. `printed` is the body's (start, end) when it was read in XLA's printed
    form, else None; `spanning` holds its instructions printed over several lines, with their offsets.
    """

    name: str
    is_entry: bool
    start: int
    end: int
    complete: bool = True
    instructions: tuple[Instruction, ...] = ()
    calls: tuple[Call, ...] = ()
    malformed: tuple[Malformed, ...] = ()
    printed: tuple[int, int] | None = None
    spanning: tuple[tuple[int, int, Instruction], ...] = ()


@dataclass(frozen=True)
class Truncation:
    """The text ends inside computation `computation` (header at `start`) after `read` instructions;
    `cut` is the instruction the end cut off, if one was."""

    computation: str
    start: int
    read: int
    cut: Malformed | None


@dataclass(frozen=True, eq=False)
class Module:
    """A read module. `entry` is the ENTRY computation (or the last one), None if the text ends first."""

    text: str
    name: str | None
    num_devices: int | None
    computations: tuple[Computation, ...]
    entry: str | None
    truncation: Truncation | None
    skipped: tuple[int, ...]  # offsets of text between computations that is no HLO

    @functools.cached_property
    def by_name(self) -> dict[str, Computation]:
        """Computations by name."""
        return {c.name: c for c in self.computations}

    @functools.cached_property
    def instruction_tables(self) -> dict[str, tuple[Instruction, ...]]:
        """Each computation's instructions, kept once read (`hlo.executions.computation_instructions` fills
        it): the collectives, work, narrowing and origin readers of one module share one reading of its text."""
        return {}


def parameter_index(parameter: Instruction) -> int:
    """The number of a `parameter(3)` instruction (read as its only operand), -1 if it has none."""
    return int(parameter.operands[0]) if parameter.operands and parameter.operands[0].isdigit() else -1


def tuple_index(instruction: Instruction) -> int | None:
    """The element a `get-tuple-element` reads (None for any other instruction, or an unreadable index)."""
    if instruction.opcode != "get-tuple-element":
        return None
    index = instruction.attribute("index")
    return int(index) if index is not None and index.isdigit() else None


def users_of(instructions: Sequence[Instruction]) -> dict[str, list[Instruction]]:
    """Each value's users among `instructions` (one computation's), in order, each user once."""
    users: dict[str, list[Instruction]] = {}
    for instruction in instructions:
        for operand in dict.fromkeys(instruction.operands):
            users.setdefault(operand, []).append(instruction)
    return users
