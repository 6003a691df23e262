"""The HLO grammar, read token by token as XLA's parser reads it (`hlo_parser.cc`), with recovery.

    module       ::= [HloModule name (',' attribute)*] table* computation*
    table        ::= (FileNames | FunctionNames | FileLocations | StackFrames) (int (string | '{…}'))*
    computation  ::= [ENTRY] name ['(' params ')' '->' shape] '{' instruction* '}' [',' attribute]*
    instruction  ::= [ROOT] name '=' shape opcode '(' operands ')' (',' attribute)*
    attribute    ::= attribute_name '=' value

Names may carry a `%` or not; an instruction may span any number of lines; comments and strings are
tokens (see `text`). Attribute values are kept as their spelling without whitespace or comments, so a
newer compiler's attributes cost nothing: only the ones shardscope reads are interpreted, elsewhere.

Unlike XLA's parser, which stops at the first error, this one recovers, so that one odd instruction does
not hide a module's collectives: a malformed instruction is recorded (with a guess at its opcode) and
reading resumes at the next line that starts an instruction (`[ROOT] name =`), closes the computation or
starts another one. In valid HLO no line inside an instruction can start that way, so recovery never
changes how valid text reads. Nothing here recurses on nesting: brackets are an explicit stack.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from dataclasses import dataclass

from shardscope.hlo.records import Instruction, Malformed
from shardscope.hlo.text import NAME, NUMBER, PUNCT, WORD, Cursor, Token, clean, operand_name

__all__ = ["ComputationText", "is_computation_start", "read_computation", "read_instruction"]

_OPEN = {"(": ")", "[": "]", "{": "}", "<": ">"}  # `<…>`: the `@mesh<a=4,b=2>` spelling of groups
_CLOSE = frozenset(_OPEN.values())
_HEADER_LINE = re.compile(r"[ \t]*(?:ENTRY[ \t]+)?%?[A-Za-z_][\w.\-]*[ \t]*(?:\(.*\)[ \t]*->.*)?\{[ \t]*(?://.*)?$")


@dataclass(frozen=True)
class ComputationText:
    """A computation as the grammar read it: every instruction, and whether the text closed it.

    `complete` is False when the text ends inside it (a truncated file) or another computation starts
    before its closing brace.
    """

    name: str
    is_entry: bool
    start: int
    end: int
    complete: bool
    instructions: tuple[Instruction, ...]
    malformed: tuple[Malformed, ...]
    cut: Malformed | None = None  # an instruction the end of the text cut off


class _Error(Exception):
    """Inside this module only: the tokens at the cursor break the grammar."""


class _End(Exception):
    """Inside this module only: the tokens ran out."""


def _peek(c: Cursor, ahead: int = 0) -> Token:
    token = c.peek(ahead)
    if token is None:
        raise _End
    return token


def _is(token: Token | None, text: str) -> bool:
    return token is not None and token.kind == PUNCT and token.text == text


def _starts_instruction(c: Cursor, ahead: int = 0) -> bool:
    """`[ROOT] name =` at the cursor: `%name` then `=`, or an identifier, space, `=` (`name=` is an attribute)."""
    token = c.peek(ahead)
    if token is None:
        return False
    nxt = c.peek(ahead + 1)
    if token.kind == WORD and token.text == "ROOT" and nxt is not None and nxt.kind in (NAME, WORD):
        return _starts_instruction(c, ahead + 1)
    after = c.peek(ahead + 1)
    if not _is(after, "=") or after is None:
        return False
    return token.kind == NAME or (token.kind == WORD and after.start > token.end)


def is_computation_start(c: Cursor, ahead: int = 0) -> bool:
    """`ENTRY`, or a name followed by its signature `(` or its body `{`."""
    token = c.peek(ahead)
    if token is None:
        return False
    if token.kind == WORD and token.text == "ENTRY":
        return True
    return token.kind in (NAME, WORD) and (_is(c.peek(ahead + 1), "(") or _is(c.peek(ahead + 1), "{"))


def _recovery_point(c: Cursor, token: Token) -> bool:
    """A line that, in valid HLO, can only start an instruction or a computation."""
    if not token.line_start:
        return False
    if _starts_instruction(c):
        return True
    end = c.text.find("\n", token.start)
    return bool(_HEADER_LINE.match(c.text, c.text.rfind("\n", 0, token.start) + 1, end if end >= 0 else len(c.text)))


def _balanced(c: Cursor, stop_at_depth0: frozenset[str], head_ends: bool, line_ends: bool = False) -> int:
    """Consumes tokens until, with no bracket open, the next one is in `stop_at_depth0`, or starts an
    instruction (if `head_ends`), or a line after the first token consumed (if `line_ends`). Returns the
    index of the first token not consumed.

    Raises _Error on a closing bracket that closes nothing or the wrong bracket, or on a line that can only
    start an instruction or a computation while a bracket is open; _End if the tokens run out inside one.
    """
    stack: list[str] = []
    first = c.i
    while True:
        token = c.peek()
        if token is None:
            if stack:
                raise _End
            return c.i
        if not stack:
            if token.kind == PUNCT and token.text in stop_at_depth0:
                return c.i
            if head_ends and _starts_instruction(c):
                return c.i
            if line_ends and token.line_start and c.i > first:
                return c.i
        elif _recovery_point(c, token):
            raise _Error
        if token.kind == PUNCT:
            if token.text in _OPEN:
                stack.append(_OPEN[token.text])
            elif token.text in _CLOSE:
                if not stack:
                    return c.i  # closes something outside: the caller decides
                if stack.pop() != token.text:
                    raise _Error
        c.take()


def _value(c: Cursor) -> tuple[int, int]:
    """An attribute value: tokens up to a `,` or closing bracket at depth 0, or the next instruction.
    Returns its (start, end) offsets."""
    first = c.i
    # A value does not go on, outside brackets, on a new line: what follows is the next instruction (or
    # text that is none, which then does not take the instruction before it down with it).
    end = _balanced(c, frozenset({",", "}", ")", "]"}), head_ends=True, line_ends=True)
    if end == first:
        raise _Error
    return c.tokens[first].start, c.tokens[end - 1].end


def _attributes(c: Cursor) -> list[tuple[str, str]]:
    """`(',' name '=' value)*`; `replica_groups=mesh[…], device_ids=(…) {…}` stays one attribute."""
    out: list[tuple[str, str]] = []
    previous = 0
    while _is(c.peek(), ","):
        key, eq = c.peek(1), c.peek(2)
        if key is None or eq is None:
            raise _End
        if key.kind != WORD or not _is(eq, "="):
            raise _Error
        c.take(), c.take(), c.take()
        start, end = _value(c)
        if key.text == "device_ids" and out and out[-1][0] == "replica_groups":
            out[-1] = ("replica_groups", clean(c.text[previous:end]))
        else:
            out.append((key.text, clean(c.text[start:end])))
            previous = start
    return out


def _operands(c: Cursor) -> list[str]:
    """'(' operand (',' operand)* ')' → each operand's name (see `operand_name`)."""
    c.take()  # "("
    names: list[str] = []
    first: Token | None = None
    last: Token | None = None
    depth = 0
    while True:
        token = _peek(c)
        if depth and _recovery_point(c, token):
            raise _Error
        if token.kind == PUNCT and token.text in _CLOSE and depth == 0:
            if token.text != ")":
                raise _Error
            c.take()
            if first is not None and last is not None:
                names.append(operand_name(c.text[first.start : last.end]))
            elif names:
                raise _Error
            return names
        if depth == 0 and _is(token, ","):
            if first is None or last is None:
                raise _Error
            names.append(operand_name(c.text[first.start : last.end]))
            first = last = None
            c.take()
            continue
        if depth == 0 and token.line_start and _starts_instruction(c):
            raise _Error
        if token.kind == PUNCT and token.text in _OPEN:
            depth += 1
        elif token.kind == PUNCT and token.text in _CLOSE:
            depth -= 1
        first = token if first is None else first
        last = token
        c.take()


def _guess_opcode(tokens: list[Token]) -> str | None:
    """The first identifier directly before a `(`, for reporting what a malformed instruction was."""
    for token, nxt in itertools.pairwise(tokens):
        if token.kind == WORD and _is(nxt, "("):
            return token.text
    return None


def _instruction(c: Cursor) -> Instruction:
    """One instruction at the cursor (raises _Error or _End)."""
    start = _peek(c)
    is_root = start.kind == WORD and start.text == "ROOT" and _peek(c, 1).kind in (NAME, WORD)
    if is_root:
        c.take()
    name = _peek(c)
    if name.kind not in (NAME, WORD) or not _is(_peek(c, 1), "="):
        raise _Error
    c.take(), c.take()
    shape_start = c.i
    while True:  # the shape: everything before the first identifier followed by "(" outside brackets
        end = _balanced(c, frozenset({"(", ",", "}"}), head_ends=True)
        token = _peek(c)
        if _is(token, "(") and end > shape_start and c.tokens[end - 1].kind == WORD:
            break
        if _is(token, "(") and end == shape_start:  # a tuple shape
            _bracketed(c)
            continue
        raise _Error
    opcode = c.tokens[c.i - 1]
    shape = clean(c.text[c.tokens[shape_start].start : c.tokens[c.i - 2].end]) if c.i - 1 > shape_start else ""
    operands = _operands(c)
    attributes = _attributes(c)
    return Instruction(name.bare, opcode.text, shape, tuple(operands), tuple(attributes), start.start, is_root)


def read_instruction(text: str, start: int, end: int | None = None) -> tuple[Instruction, int] | None:
    """The instruction starting at `start` and the offset where it ends, or None if none parses there.

    With `end`, the instruction must be exactly `text[start:end]` (one printed line); without, it runs as
    far as the grammar says and must be followed by another instruction or the computation's `}`.
    """
    c = Cursor(text, start, end)
    try:
        instruction = _instruction(c)
    except (_Error, _End):
        return None
    nxt = c.peek()
    if nxt is not None and (end is not None or not (_is(nxt, "}") or _starts_instruction(c))):
        return None
    return instruction, c.tokens[c.i - 1].end


def _resync(c: Cursor, first: int) -> None:
    """Skips to the next line that starts an instruction, closes a computation or starts another one."""
    if c.i == first:
        c.take()
    while True:
        token = c.peek()
        if token is None or (token.line_start and (_is(token, "}") or _recovery_point(c, token))):
            return
        c.take()


def _bracketed(c: Cursor) -> None:
    """Consumes a bracketed group starting at the cursor (raises _Error if it does not close properly)."""
    opening = c.take()
    if opening is None:
        raise _End
    _balanced(c, frozenset({_OPEN[opening.text]}), head_ends=False)
    if not _is(c.take(), _OPEN[opening.text]):
        raise _Error


def _header(c: Cursor) -> tuple[str, bool]:
    """`[ENTRY] name [signature] {` → (name, is_entry); the cursor ends after the `{`."""
    token = _peek(c)
    is_entry = token.kind == WORD and token.text == "ENTRY"
    if is_entry:
        c.take()
    name = _peek(c)
    if name.kind not in (NAME, WORD):
        raise _Error
    c.take()
    if _is(c.peek(), "("):
        _bracketed(c)
        if not _is(c.take(), "->"):
            raise _Error
        token = _peek(c)
        if _is(token, "("):
            _bracketed(c)
        elif token.kind == WORD:
            c.take()
            if _is(c.peek(), "["):
                _bracketed(c)
            after = c.peek(1)
            if _is(c.peek(), "{") and after is not None and (after.kind == NUMBER or after.text in (":", "}")):
                _bracketed(c)  # a layout, not the body: XLA tells them apart the same way
    if not _is(c.take(), "{"):
        raise _Error
    return name.bare, is_entry


def read_computation(text: str, start: int) -> ComputationText | None:
    """The computation whose header starts at `start`, or None if no computation header is there."""
    c = Cursor(text, start)
    try:
        name, is_entry = _header(c)
    except (_Error, _End):
        return None
    instructions: list[Instruction] = []
    malformed: list[Malformed] = []
    while True:
        token = c.peek()
        if token is None:
            return ComputationText(name, is_entry, start, len(text), False, tuple(instructions), tuple(malformed))
        if _is(token, "}"):
            c.take()
            with contextlib.suppress(_Error, _End):
                _attributes(c)  # `}, execution_thread="…"`
            end = c.tokens[c.i - 1].end
            return ComputationText(name, is_entry, start, end, True, tuple(instructions), tuple(malformed))
        if token.line_start and not _starts_instruction(c) and _recovery_point(c, token):
            # another computation starts before this one closed
            return ComputationText(name, is_entry, start, token.start, False, tuple(instructions), tuple(malformed))
        first = c.i
        try:
            instructions.append(_instruction(c))
        except _Error:
            malformed.append(Malformed(token.start, _guess_opcode(c.tokens[first : c.i + 1])))
            _resync(c, first)
        except _End:
            cut = Malformed(token.start, _guess_opcode(c.tokens[first:]))
            return ComputationText(name, is_entry, start, len(text), False, tuple(instructions), tuple(malformed), cut)
