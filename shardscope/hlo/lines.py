"""One line of XLA's printed form read by regex: an instruction, or the `HloModule` line.

An instruction line is `  [ROOT ]%name = shape opcode(operands), name=value, …`. Most lines (nine in ten
of a compiled train step) have the simple form `_SIMPLE_VALUE` describes and are read by one match per
attribute. The rest get one scan with a regex that starts with a character class (so the engine skips
plain text at C speed), which finds what changes bracket depth (brackets; strings, whole; groups two deep
with nothing else inside, whole) and the `, name=` that separate attributes outside brackets. Anything the
printer does not write on a line (a comment other than `/*index=N*/`, an unclosed string or bracket) makes
the reader decline, and the grammar reads the line: for every line this reader accepts it gives exactly
what `grammar.read_instruction` gives (tested).
"""

from __future__ import annotations

import re

from shardscope.hlo.records import Instruction
from shardscope.hlo.text import clean, operand_name

__all__ = ["HEAD", "read_header_line", "read_line"]

# An instruction line, up to its opcode: the shape never holds " word(" (layouts and tiles follow `{`, `:`
# or `)`), so the first one is the opcode.
HEAD = re.compile(r"  (?:ROOT )?%([A-Za-z_][A-Za-z0-9_.\-]*) = (.*?) ([a-z][a-z0-9\-]*)\(")
# What matters on a printed line, found by one of its characters (a charset first lets the regex engine
# skip the rest fast): a string (group 1 if it closes), a '…' string (2), a one-line block comment such as
# `/*index=5*/` (3), the `, name=` that separates attributes (4), a bracketed group two deep at most with no
# string or comment inside (5: most groups, whole), or a lone bracket.
_PLAIN = r"[^(){}\[\]\"'\n/]*"
_LINE_ITEMS = re.compile(
    r"[(\[{<)\]}>\"'/,]"
    r"(?:(?<=\")[^\"\\\n]*(?:\\.[^\"\\\n]*)*(\")?"
    r"|(?<=')[^'\\\n]*(?:\\.[^'\\\n]*)*(')?"
    r"|(?<=/)(\*[^*\n]*\*/)?"
    r"|(?<=,)( [a-z_][a-z0-9_\-]*=)?"
    rf"|(?<=[(\[{{])({_PLAIN}(?:[(\[{{]{_PLAIN}[)\]}}]{_PLAIN})*[)\]}}])?"
    r"|)"
)
_CLOSER = {"(": ")", "[": "]", "{": "}", "<": ">"}
# Most printed lines are simpler than the scan allows for: operands without brackets (`%a, %b`, `0`) and
# attributes whose values are a plain word, a string, or braces holding plain text, strings and one-deep
# `[…]` (`metadata={op_name="…"}`, `dimensions={0,2}`, `slice={[0:1], [0:32]}`). Such a line is read by one
# match for its operands and one per attribute; anything else (nested braces, `<` or `>`, comments, escapes)
# goes to the scan.
# Possessive quantifiers (`*+`, `++`): the match never backtracks into a long `metadata={…}` string.
_SIMPLE_VALUE = (
    r"""(?:\{(?:[^{}"'\[\]()<>/\\\n]++|\[[^\[\]{}()"'<>/\\\n]*+\]|"[^"\\\n]*+")*+\}"""  # braces
    r"""|"[^"\\\n]*+"|[^\s,{}\[\]()"'<>/\\]++)"""  # a string, or a plain word
)
_SIMPLE_OPERANDS = re.compile(r"([^()\[\]{}\"'/\\\n]*)\)")
_SIMPLE_ATTRIBUTE = re.compile(rf", ([a-z_][a-z0-9_\-]*)=({_SIMPLE_VALUE})")
_MODULE_NAME = re.compile(r"HloModule ([A-Za-z_][A-Za-z0-9_.\-]*)")


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
        if (char == "<" and text.startswith("=", m.end())) or (char == ">" and text[m.start() - 1] == "-"):
            continue  # `<=` (iota groups, dynamic dims) and `->` (dim labels) are no brackets
        if char in "([{<":
            group = m.group(5)
            if group is None:
                stack.append(_CLOSER[char])
                continue
            if not _paired(char + group):
                return None
            if not stack and operands_end < 0:
                operands_end = m.end()
        elif char in ")]}>":
            if not stack or stack.pop() != char:
                return None
            if not stack and operands_end < 0:
                operands_end = m.end()
        elif char == ",":
            separator = m.group(4)
            if not stack and operands_end >= 0:
                if separator is None:
                    return None  # after the operands, a comma outside brackets starts an attribute
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
    parts = _simple_parts(text, end, head) or _scanned_parts(text, end, head)
    if parts is None:
        return None
    operands_text, attributes = parts
    operands = tuple(operand_name(p) for p in _split_operands(operands_text)) if operands_text.strip() else ()
    is_root = text.startswith("  ROOT ", start)
    shape = clean(head.group(2))
    return Instruction(head.group(1), head.group(3), shape, operands, tuple(attributes), start + 2, is_root)


def _simple_parts(text: str, end: int, head: re.Match[str]) -> tuple[str, list[tuple[str, str]]] | None:
    """(operands text, attributes) of a line of the simple form (see `_SIMPLE_VALUE`); None for any other."""
    operands = _SIMPLE_OPERANDS.match(text, head.end(), end)
    if operands is None:
        return None
    attributes: list[tuple[str, str]] = []
    pos = operands.end()
    while pos < end:
        item = _SIMPLE_ATTRIBUTE.match(text, pos, end)
        if item is None or item.group(1) == "device_ids":  # `replica_groups=…, device_ids=…` is one attribute
            return None
        attributes.append((item.group(1), clean(item.group(2))))
        pos = item.end()
    return operands.group(1), attributes


def _scanned_parts(text: str, end: int, head: re.Match[str]) -> tuple[str, list[tuple[str, str]]] | None:
    """(operands text, attributes) of any printed line, found by the scan; None if it declines the line."""
    scanned = _scan(text, head.end() - 1, end, operands=True)
    if scanned is None:
        return None
    operands_end, separators = scanned
    attributes = _attributes(text, end, separators)
    if attributes is None:
        return None
    return text[head.end() : operands_end - 1], attributes


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
    if "(" not in text and "[" not in text and "{" not in text:
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
    """Whether the brackets of a two-deep group close in the order they open (`<`, `>` inside it are
    plain characters: `[4,2]<=[8]`)."""
    if len(group) < 3 or group.count("(") + group.count("[") + group.count("{") == 1:
        return _CLOSER.get(group[0]) == group[-1]
    stack = []
    for char in group:
        if char in "([{":
            stack.append(_CLOSER[char])
        elif char in ")]}" and (not stack or stack.pop() != char):
            return False
    return not stack
