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

from shardscope.hlo.grammar import clean, operand_name, read_instruction
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

__all__ = ["calls_of", "read_header_line", "read_line", "read_printed_run", "scan_hits"]

_HEADER = re.compile(r"(ENTRY )?%([A-Za-z_][A-Za-z0-9_.\-]*) [^\n]*\{\n")
_NOT_INSTRUCTION_LINE = re.compile(r"\n(?!  %|  ROOT %)")
_CLOSING = re.compile(r"\}(?:, execution_thread=\"[^\"\\\n]*\")?[ \t]*(?=\n|\Z)")
# An instruction line, up to its opcode: the shape never holds " word(" (layouts and tiles follow `{`, `:`
# or `)`), so the first one is the opcode.
HEAD = re.compile(r"  (?:ROOT )?%([A-Za-z_][A-Za-z0-9_.\-]*) = (.*?) ([a-z][a-z0-9\-]*)\(")
# Where an instruction that matters may be: a collective-like opcode, or an attribute naming a computation.
_OPCODE_HIT = re.compile(r" (?:all-|reduce-scatter|collective-|ragged-|send|recv)[a-z0-9\-]*\(")
_CALL_HIT = re.compile(r"=\{?%")
_CALL_VALUE = re.compile(r"=(\{%[^}\n]*\}|%[A-Za-z_][A-Za-z0-9_.\-]*)")
_CALLEE = re.compile(r"%([A-Za-z_][A-Za-z0-9_.\-]*)")
_INDEX_COMMENT = re.compile(r"/\*[^*\n]*\*/")
# A whole computation as the printer writes it: header, instruction lines, closing line, blank lines.
_RUN = re.compile(
    r"((ENTRY )?%([A-Za-z_][A-Za-z0-9_.\-]*) [^\n]*\{\n)(?:  (?:ROOT )?%[^\n]*+\n)*+"
    r"(\}(?:, execution_thread=\"[^\"\\\n]*\")?[ \t]*)(?:\n(?:[ \t\r]*\n)*|\Z)"
)
_MODULE_NAME = re.compile(r"HloModule ([A-Za-z_][A-Za-z0-9_.\-]*)")
_BLANK_LINES = re.compile(r"(?:[ \t]*\n)*")
_FULL_READ = frozenset({"while", "conditional", "async-start"})  # lines always read whole
# What matters on a printed line, found by one of its characters (a charset first lets the regex engine
# skip the rest fast): a string (group 1 if it closes), a '…' string (2), a one-line block comment such as
# `/*index=5*/` (3), the `, name=` that separates attributes (4), a bracketed group two deep at most with no
# string or comment inside (5: most groups, whole), or a lone bracket.
_PLAIN = r"[^(){}\[\]\"'\n/]*"
_LINE_ITEMS = re.compile(
    r"[(\[{)\]}\"'/,]"
    r"(?:(?<=\")[^\"\\\n]*(?:\\.[^\"\\\n]*)*(\")?"
    r"|(?<=')[^'\\\n]*(?:\\.[^'\\\n]*)*(')?"
    r"|(?<=/)(\*[^*\n]*\*/)?"
    r"|(?<=,)( [a-z_][a-z0-9_\-]*=)?"
    rf"|(?<=[(\[{{])({_PLAIN}(?:[(\[{{]{_PLAIN}[)\]}}]{_PLAIN})*[)\]}}])?"
    r"|)"
)
_CLOSER = {"(": ")", "[": "]", "{": "}"}


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
    run = _RUN.match
    while True:
        m = run(text, pos)
        if m is not None:
            (_, after), (body_start, _), entry, (name_start, name_end), (body_end, end) = m.regs
            while k < size and hits[k] < body_start:
                k += 1
            if k == size or hits[k] >= body_end:  # nothing here that matters: the common case, made cheap
                name = text[name_start:name_end]
                out.append(Computation(name, entry[0] >= 0, pos, end, True, (), (), (), (body_start, body_end)))
                inert.add(name)
                pos = after
                continue
            pc = PrintedComputation(text[name_start:name_end], entry[0] >= 0, pos, (body_start, body_end), end, ())
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


def _scan(text: str, start: int, end: int, operands: bool) -> tuple[int, list[tuple[int, int, str]]] | None:
    """Where, on the printed line `text[start:end]`, the operand list ends (if `operands`: it opens at
    `start`) and the `, name=` separators outside brackets are: (end of operands, [(start, value start,
    name)]); None if the line holds what the printer does not write (a comment, an unclosed string or
    bracket)."""
    stack: list[str] = []
    operands_end = -1 if operands else start
    separators: list[tuple[int, int, str]] = []
    for m in _LINE_ITEMS.finditer(text, start, end):
        char = text[m.start()]
        if char in "([{":
            group = m.group(5)
            if group is None:
                stack.append(_CLOSER[char])
                continue
            if not _paired(char + group):
                return None
            if not stack and operands_end < 0:
                operands_end = m.end()
        elif char in ")]}":
            if not stack or stack.pop() != char:
                return None
            if not stack and operands_end < 0:
                operands_end = m.end()
        elif char == ",":
            separator = m.group(4)
            if separator and not stack and operands_end >= 0:
                separators.append((m.start(), m.end(), separator[1:-1]))
        elif m.group({'"': 1, "'": 2, "/": 3}[char]) is None:
            return None  # an unclosed string, or a comment the printer does not write
    if stack or operands_end < 0 or text[operands_end : separators[0][0] if separators else end].strip():
        return None
    return operands_end, separators


def _attributes(text: str, end: int, separators: list[tuple[int, int, str]]) -> list[tuple[str, str]] | None:
    """(name, value) of each attribute, `replica_groups=mesh[…], device_ids=(…) {…}` as one; None if a
    value is empty."""
    attributes: list[tuple[str, str]] = []
    for k, (_, value_start, key) in enumerate(separators):
        value = text[value_start : separators[k + 1][0] if k + 1 < len(separators) else end].strip()
        if not value:
            return None
        if key == "device_ids" and attributes and attributes[-1][0] == "replica_groups":
            attributes[-1] = ("replica_groups", text[separators[k - 1][1] : value_start + len(value)].strip())
        else:
            attributes.append((key, clean(value)))
    return attributes


def read_line(text: str, start: int, end: int) -> Instruction | None:
    """The instruction on the printed line `text[start:end]`, read by regex; None if the line holds
    anything the printer does not write there (a comment, an unclosed string or bracket), which the grammar
    then reads. Gives exactly what `grammar.read_instruction` gives for every line it accepts."""
    head = HEAD.match(text, start, end)
    if head is None:
        return None
    scanned = _scan(text, head.end() - 1, end, operands=True)
    if scanned is None:
        return None
    operands_end, separators = scanned
    attributes = _attributes(text, end, separators)
    if attributes is None:
        return None
    operands_text = text[head.end() : operands_end - 1]
    operands = tuple(operand_name(p) for p in _split_operands(operands_text)) if operands_text.strip() else ()
    is_root = text.startswith("  ROOT ", start)
    shape = clean(head.group(2))
    return Instruction(head.group(1), head.group(3), shape, operands, tuple(attributes), start + 2, is_root)


def read_header_line(text: str, start: int) -> tuple[str, tuple[tuple[str, str], ...], int] | None:
    """`HloModule name, attributes…` printed on one line at `start`: (name, attributes, end of line), or
    None for any other form (the grammar reads it)."""
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    name = _MODULE_NAME.match(text, start, end)
    if name is None:
        return None
    scanned = _scan(text, name.end(), end, operands=False)
    attributes = _attributes(text, end, scanned[1]) if scanned else None
    if attributes is None:
        return None
    return name.group(1), tuple(attributes), end


def _split_operands(text: str) -> list[str]:
    """Operands split at commas outside brackets."""
    if not any(c in text for c in "([{"):
        return text.split(",")
    parts, depth, begin = [], 0, 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
    return [*parts, text[begin:]]


def _paired(group: str) -> bool:
    """Whether the brackets of a two-deep group close in the order they open."""
    if len(group) < 3 or group.count("(") + group.count("[") + group.count("{") == 1:
        return _CLOSER.get(group[0]) == group[-1]
    stack = []
    for char in group:
        if char in _CLOSER:
            stack.append(_CLOSER[char])
        elif char in ")]}" and (not stack or stack.pop() != char):
            return False
    return not stack
