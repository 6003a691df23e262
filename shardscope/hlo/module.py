"""An HLO module as a reader of collectives needs it: computations, the instructions in them that matter,
every call between them, and what the text left out (a truncated file, malformed instructions).

Computations in XLA's printed form are read by `printed` (line scans); every other computation, and any
text between computations, by `grammar` (tokens). Both give the same records. Only the instructions that
matter are kept (collectives and their async halves, collective-like opcodes, loops); `InstructionTable`
reads any other instruction of a computation on demand (loop trip counts need a few), and
`executions.Program` every instruction of the computations that run (a count of FLOPs needs them all).

XLA's rules, where they bear on what is counted: a computation name defined twice, a second `ENTRY` or a
second `HloModule` is an error (XLA's parser rejects them too); without `ENTRY`, the last computation is
the entry; `HloModule` may be absent.
"""

from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Iterator

from shardscope.errors import ShardscopeError
from shardscope.hlo.grammar import ComputationText, is_computation_start, read_computation, read_instruction
from shardscope.hlo.header import TABLE_KEYWORDS, read_module_header, skip_line, skip_table
from shardscope.hlo.lines import read_header_line, read_line
from shardscope.hlo.printed import calls_of, read_printed_run, scan_hits
from shardscope.hlo.records import Computation, Instruction, Module, Truncation, matters
from shardscope.hlo.text import WORD, Cursor, decode, line_of

__all__ = ["HloParseError", "InstructionTable", "gc_paused", "read_module"]

_BLANK = re.compile(r"[ \t\r\n]*")
_LINE_NAME = re.compile(r"\n  (ROOT )?%([A-Za-z_][A-Za-z0-9_.\-]*) = ")


class HloParseError(ShardscopeError, ValueError):
    """The text is not an HLO module, or one XLA's parser would reject as a whole (a name defined twice)."""


def _from_text(comp: ComputationText, inert: set[str]) -> Computation:
    instructions = tuple(i for i in comp.instructions if matters(i))
    calls = tuple(call for i in comp.instructions for call in calls_of(i, inert))
    return Computation(
        comp.name, comp.is_entry, comp.start, comp.end, comp.complete, instructions, calls, comp.malformed
    )


def _num_devices(attributes: tuple[tuple[str, str], ...]) -> int | None:
    counts = [int(v) for k, v in attributes if k in ("num_partitions", "replica_count") and v.isdigit()]
    if not counts:
        return None
    product = 1
    for count in counts:
        product *= count
    return product


def read_module(data: str | bytes) -> Module:
    """Reads every computation of an HLO module's text (any encoding; undecodable bytes become U+FFFD).

    Raises:
      HloParseError: if the text holds no computation, names a computation twice, has two ENTRY
        computations or a second `HloModule` header.
    """
    with gc_paused():
        return _read_module(decode(data))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector (if it runs) for the block.

    A dump holds 100,000s of computations: records without cycles, whose creation would otherwise set off
    the collector over and over, each time walking every object of the process (a quarter of the reading
    time in a process that has compiled a model).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read_module(text: str) -> Module:
    hits: list[int] | None = None
    computations: list[Computation] = []
    inert: set[str] = set()  # computations read so far that hold nothing that counts
    skipped: list[int] = []
    name: str | None = None
    num_devices: int | None = None
    truncation: Truncation | None = None
    first_item = True
    pos, size = 0, len(text)
    while pos < size:
        pos = _BLANK.match(text, pos).end()  # type: ignore[union-attr]  # `*`: always matches
        if text.startswith(("%", "ENTRY %"), pos) and (pos == 0 or text[pos - 1] == "\n"):
            hits = scan_hits(text) if hits is None else hits
            before = len(computations)
            pos = read_printed_run(text, pos, hits, inert, computations)  # XLA's printed form: the fast path
            first_item = first_item and len(computations) == before
        cursor = Cursor(text, pos)
        token = cursor.peek()
        if token is None:
            break
        if token.kind == WORD and token.text == "HloModule":
            if not first_item:
                raise HloParseError(
                    f"line {line_of(text, token.start)}: a second 'HloModule' header; expected one module per file"
                )
            header = read_header_line(text, token.start) or read_module_header(text, token.start)
            name, attributes, pos = header
            num_devices = _num_devices(attributes)
        elif token.kind == WORD and token.text in TABLE_KEYWORDS:
            pos = skip_table(text, token.start)
        elif is_computation_start(cursor) and (read := read_computation(text, token.start)) is not None:
            comp = _from_text(read, inert)
            computations.append(comp)
            if not (comp.instructions or comp.calls or comp.malformed):
                inert.add(comp.name)
            pos = read.end
            if not read.complete and read.end >= size:
                truncation = Truncation(read.name, read.start, len(read.instructions), read.cut)
        else:
            skipped.append(token.start)
            pos = skip_line(text, token.start)
        first_item = False
    _check_names(text, computations)
    if not computations:
        raise HloParseError(_not_hlo(text))
    entries = [c.name for c in computations if c.is_entry]
    entry = entries[0] if entries else (None if truncation else computations[-1].name)
    return Module(text, name, num_devices, tuple(computations), entry, truncation, tuple(skipped))


def _check_names(text: str, computations: list[Computation]) -> None:
    names = [c.name for c in computations]
    entries = [c for c in computations if c.is_entry]
    if len(set(names)) == len(names) and len(entries) <= 1:
        return
    first: dict[str, Computation] = {}
    for comp in computations:
        if comp.name in first:
            raise HloParseError(
                f"computation {comp.name!r} is defined twice (lines {line_of(text, first[comp.name].start)} and"
                f" {line_of(text, comp.start)}); XLA's parser rejects this too: keep one module per file"
            )
        first[comp.name] = comp
    one, two = entries[:2]
    raise HloParseError(
        f"two ENTRY computations, {one.name!r} (line {line_of(text, one.start)}) and {two.name!r}"
        f" (line {line_of(text, two.start)}); expected one"
    )


def _not_hlo(text: str) -> str:
    found = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if found.startswith("HloModule"):
        return "HLO module has no computations: expected '%name (...) -> ... {' or 'ENTRY main {' blocks, found none"
    return f"not HLO text: expected 'HloModule' or a computation such as 'ENTRY main {{', found {found[:60]!r}"


class InstructionTable:
    """Every instruction of one computation by name, read on demand (a loop's trip count needs a few of
    the thousands a loop body may hold). `root` is the ROOT instruction's name (else the last one's)."""

    def __init__(self, module: Module, name: str) -> None:
        self._text = module.text
        self._comp = module.by_name.get(name)
        self._read: dict[str, Instruction] = {}
        self._lines: dict[str, int] = {}
        self.root = ""
        comp = self._comp
        if comp is None:
            return
        if comp.printed is None:
            full = read_computation(self._text, comp.start)
            instructions = full.instructions if full else ()
            self._read = {i.name: i for i in instructions}
            roots = [i.name for i in instructions if i.is_root]
            self.root = roots[0] if roots else instructions[-1].name if instructions else ""
            return
        start, end = comp.printed
        root, last = "", ""
        for m in _LINE_NAME.finditer(self._text, start - 1, end):
            self._lines[m.group(2)] = m.start() + 1
            root, last = (m.group(2) if m.group(1) else root), m.group(2)
        for _, _, instruction in comp.spanning:
            self._read[instruction.name] = instruction
            root = instruction.name if instruction.is_root else root
        self.root = root or last

    def get(self, name: str) -> Instruction | None:
        """The instruction of that name, or None."""
        if name in self._read:
            return self._read[name]
        start = self._lines.get(name)
        if start is None:
            return None
        end = self._text.find("\n", start)
        end = end if end >= 0 else len(self._text)
        instruction = read_line(self._text, start, end)
        if instruction is None:
            read = read_instruction(self._text, start, end)
            instruction = read[0] if read else None
        if instruction is not None:
            self._read[name] = instruction
        return instruction
