"""Computations in the form XLA's printer writes them, read without tokenising every instruction.

`HloModule::ToString()` (what `Compiled.as_text()` and `--xla_dump_to` write) prints a computation as

    %name (params) -> shape {          ENTRY %name … {  for the entry
      %instruction = shape opcode(…), attributes…
      ROOT %instruction = …
    }                                  or  }, execution_thread="…"

one instruction per line, strings escaped (no raw line breaks), names with `%`. Dumps run to hundreds of
megabytes, and tokenising all of it in Python would read a few MB/s; so here C-speed scans find where each
computation ends (the first line that does not start with `  %` / `  ROOT %`), and the caller tokenises only
the lines that matter (collectives, loops, calls), each with the full grammar.

A line that does not start an instruction is not always the closing brace: a printed attribute value may
span lines (a Pallas kernel's `frontend_attributes={kernel_metadata={…` ends on a line `}}, metadata=…`).
Such an instruction is read by the grammar from the instruction line before it, and the scan resumes
after it. Anything else the printer does not write (comments, unindented or `%`-less instructions, text
that ends before the closing brace) makes `read_printed` decline, and the computation is read token by
token. The one assumption: a string or comment spanning lines in printed form has no line inside it
that starts with `  %` (XLA's printer escapes line breaks in strings, so its output never does).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Container
from typing import NamedTuple

from shardscope.hlo.grammar import read_instruction
from shardscope.hlo.lines import HEAD, read_line
from shardscope.hlo.records import (
    ASYNC_ENDS,
    CALL_ATTRIBUTES,
    COLLECTIVE_LIKE,
    Call,
    Computation,
    Instruction,
    Malformed,
    matters,
)

__all__ = ["calls_of", "read_printed_run", "scan_hits"]

_HEADER = re.compile(r"(ENTRY )?%([A-Za-z_][A-Za-z0-9_.\-]*) [^\n]*\{\n")
_NOT_INSTRUCTION_LINE = re.compile(r"\n(?!  %|  ROOT %)")
_CLOSING = re.compile(r"\}(?:, execution_thread=\"[^\"\\\n]*\")?[ \t]*(?=\n|\Z)")
# Where an instruction that matters may be: a collective-like opcode, or an attribute naming a computation.
_OPCODE_HIT = re.compile(r" (?:all-|reduce-scatter|collective-|ragged-|send|recv)[a-z0-9\-]*\(")
_CALL_HIT = re.compile(r"=\{?%")
_CALL_VALUE = re.compile(r"=(\{%[^}\n]*\}|%[A-Za-z_][A-Za-z0-9_.\-]*)")
_CALLEE = re.compile(r"%([A-Za-z_][A-Za-z0-9_.\-]*)")
_INDEX_COMMENT = re.compile(r"/\*[^*\n]*\*/")
_BLANK_AFTER = re.compile(r"\n(?:[ \t\r]*\n)*|\Z")
_BLANK_LINES = re.compile(r"(?:[ \t]*\n)*")
_FULL_READ = frozenset({"while", "conditional", "async-start"})  # lines always read whole


class PrintedComputation(NamedTuple):
    """Where a printed computation's parts are, and the instructions in it that span several lines.

    Attributes:
      name, is_entry: from its header.
      start: offset of the header line; body: offsets of the first instruction line and of the closing line;
      end: offset after the closing line's text.
      spanning: (start, end, instruction) of every instruction printed over several lines.
    """

    name: str
    is_entry: bool
    start: int
    body: tuple[int, int]
    end: int
    spanning: tuple[tuple[int, int, Instruction], ...]


def _locate(text: str, start: int) -> PrintedComputation | None:
    """Where the parts of the printed computation whose header line starts at `start` are, or None if it
    is not in printed form."""
    header = _HEADER.match(text, start)
    if header is None:
        return None
    body_start = header.end()
    scan_from = body_start - 1  # the header's line break
    spanning: list[tuple[int, int, Instruction]] = []
    while True:
        line_break = _NOT_INSTRUCTION_LINE.search(text, scan_from)
        if line_break is None:
            return None  # the text ends inside the body
        line = line_break.end()
        closing = _CLOSING.match(text, line)
        if closing is not None:
            return PrintedComputation(
                header.group(2), header.group(1) is not None, start, (body_start, line), closing.end(), tuple(spanning)
            )
        # Not an instruction line: the rest of the instruction on the line before, if it is one.
        previous = text.rfind("\n", 0, line - 1) + 1
        if previous <= scan_from:
            return None
        read = read_instruction(text, previous)
        if read is None:
            return None
        instruction, end = read
        line_end = text.find("\n", end)
        if line_end < 0 or text[end:line_end].strip():
            return None
        spanning.append((previous, line_end, instruction))
        scan_from = line_end


def calls_of(instruction: Instruction, leave_out: Container[str] = ()) -> list[Call]:
    """The calls an instruction makes, less those to computations in `leave_out`."""
    if instruction.opcode.endswith(ASYNC_ENDS):
        return []  # an async done names the start's computation again: it is one call
    return [
        Call(callee, key, instruction.name, instruction.opcode)
        for key, callee in instruction.callees()
        if callee not in leave_out
    ]


def read_printed_run(text: str, pos: int, hits: list[int], inert: set[str], out: list[Computation]) -> int:
    """Reads printed computations one after another from `pos` into `out`; returns where the run ends
    (the first text that is not a printed computation).

    Only the lines holding a hit (see `scan_hits`) are read; a hit naming only computations in `inert` is
    passed over. A computation that holds nothing that counts is added to `inert`.
    """
    k = bisect.bisect_left(hits, pos)
    size = len(hits)
    header_at, line_after, closing_at, blank_after = (
        _HEADER.match,
        _NOT_INSTRUCTION_LINE.search,
        _CLOSING.match,
        _BLANK_AFTER.match,
    )
    while True:
        # A computation as the printer writes it: its header line, lines that each start an instruction,
        # its closing line, blank lines. (Three C-speed steps; one regex for the whole is twice as slow.)
        header = header_at(text, pos)
        rest = line_after(text, header.end() - 1) if header is not None else None
        closing = closing_at(text, rest.end()) if rest is not None else None
        if header is not None and closing is not None:
            body_start, body_end, end = header.end(), closing.start(), closing.end()
            after = blank_after(text, end).end()  # type: ignore[union-attr]  # at a line's end: always matches
            is_entry = header.start(1) >= 0
            while k < size and hits[k] < body_start:
                k += 1
            if k == size or hits[k] >= body_end:  # nothing here that matters: the common case, made cheap
                name = header.group(2)
                out.append(Computation(name, is_entry, pos, end, True, (), (), (), (body_start, body_end)))
                inert.add(name)
                pos = after
                continue
            pc = PrintedComputation(header.group(2), is_entry, pos, (body_start, body_end), end, ())
        else:
            located = _locate(text, pos)  # instructions printed over several lines, or no printed form
            if located is None:
                return pos
            pc = located
            after = _BLANK_LINES.match(text, pc.end).end()  # type: ignore[union-attr]  # `*`: always matches
        body_start, body_end = pc.body
        k = bisect.bisect_left(hits, body_start, k)
        last = bisect.bisect_left(hits, body_end, k)
        comp = _assemble(text, pc, hits, k, last, inert)
        out.append(comp)
        if not (comp.instructions or comp.calls or comp.malformed):
            inert.add(comp.name)
        k, pos = last, after


def _assemble(
    text: str, pc: PrintedComputation, hits: list[int], k: int, last: int, inert: Container[str]
) -> Computation:
    """A printed computation from the lines holding hits[k:last]."""
    body_start, body_end = pc.body
    instructions: list[Instruction] = []
    calls: list[Call] = []
    malformed: list[Malformed] = []
    spans = [s for s, _, _ in pc.spanning]
    while k < last:
        hit = hits[k]
        s = bisect.bisect_right(spans, hit) - 1 if spans else -1
        if s >= 0 and hit < pc.spanning[s][1]:
            _, end, instruction = pc.spanning[s]
            while k < last and hits[k] < end:
                k += 1
            instructions += [instruction] if matters(instruction) else []
            calls += calls_of(instruction, inert)
            continue
        end = text.find("\n", hit, body_end)
        end = body_end - 1 if end < 0 else end
        on_line: list[int] = []
        only_calls = True
        while k < last and hits[k] < end:
            h = hits[k]
            k += 1
            if text[h] != "=":
                only_calls = False
            elif (value := _CALL_VALUE.match(text, h)) is not None and (
                value.group(1)[1:] in inert
                if value.group(1)[0] == "%"
                else all(n in inert for n in _CALLEE.findall(value.group(1)))
            ):
                continue  # names only computations that hold nothing: no need to read the line
            on_line.append(h)
        if not on_line:
            continue
        line = text.rfind("\n", body_start - 1, hit) + 1
        head = HEAD.match(text, line, end)
        if head is not None and only_calls:
            opcode = head.group(3)
            if opcode not in _FULL_READ and not opcode.endswith(ASYNC_ENDS) and not COLLECTIVE_LIKE.match(opcode):
                quick = _quick_calls(text, line, on_line, opcode, head.group(1))
                if quick is not None:
                    calls += quick
                    continue
        read = read_line(text, line, end)
        if read is None:
            whole = read_instruction(text, line, end)
            read = whole[0] if whole else None
        if read is None:
            malformed.append(Malformed(line + 2, head.group(3) if head else None))
            continue
        instructions += [read] if matters(read) else []
        calls += calls_of(read, inert)
    instructions.sort(key=lambda i: i.offset)  # text order, spanning ones included
    return Computation(
        pc.name, pc.is_entry, pc.start, pc.end, True, tuple(instructions), tuple(calls), tuple(malformed),
        pc.body, pc.spanning,
    )  # fmt: skip


def _quick_calls(text: str, start: int, hits: list[int], opcode: str, site: str) -> list[Call] | None:
    """Calls of a printed line whose opcode needs nothing else, read at its `=%` hits by regex; None if a
    string or comment comes before the last hit (only the tokens can tell whether it is inside one)."""
    prefix = text[start : hits[-1]]
    if "/*" in prefix:
        prefix = _INDEX_COMMENT.sub("", prefix)  # tuple shapes and long operand lists number their items
    if '"' in prefix or "'" in prefix or "/*" in prefix or "//" in prefix:
        return None
    calls: list[Call] = []
    for hit in hits:
        key = text[text.rfind(" ", start, hit) + 1 : hit]
        value = _CALL_VALUE.match(text, hit)
        if key in CALL_ATTRIBUTES and value is not None:
            calls += [Call(name, key, site, opcode) for name in _CALLEE.findall(value.group(1))]
    return calls


def scan_hits(text: str) -> list[int]:
    """Sorted offsets of every place an instruction that matters may be (see `_OPCODE_HIT`, `_CALL_HIT`)."""
    hits = [m.start() for m in _OPCODE_HIT.finditer(text)]
    hits += [m.start() for m in _CALL_HIT.finditer(text)]
    hits.sort()
    return hits
