"""HLO text as XLA's lexer sees it: tokens, with strings and comments whole, and where each line starts.

The token classes follow XLA's `hlo_lexer.cc`: whitespace and comments (`// …` to the end of the line,
`/* … */` across lines) separate tokens and are dropped; strings are `"…"` or `'…'` with backslash escapes
and may hold newlines; `%name` is a name; identifiers (`[A-Za-z_][A-Za-z0-9_.-]*`) are opcodes, types,
keywords, attribute names (when `=` follows at once) and, in text written without `%`, names. Numbers and
XLA's number-like patterns (`0_512`, `2x2`, `1e-05`, `-inf`) are one token. Anything else is one character
of punctuation, so malformed text still tokenises: the grammar decides what to make of it.

Each token records whether a line break precedes it: a line that starts with `name =` begins a new
instruction whatever came before (in valid HLO nothing else can start that way), which is how the grammar
recovers from a malformed instruction without losing the rest of its computation.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Cursor", "Token", "clean", "decode", "line_of", "operand_name", "tokenize"]

# Token kinds: the number of the regex group that matched (group 1 is a line break in the trivia before).
STRING, NAME, WORD, NUMBER, PUNCT, OTHER = range(2, 8)

_TOKEN = re.compile(
    r"(?:[ \t\r\f\v]+|(\n)|//[^\n]*|/\*[^*]*\*+(?:[^/*][^*]*\*+)*/)*"  # trivia: whitespace and comments
    r"(?:(\"[^\"\\]*(?:\\.[^\"\\]*)*\"|'[^'\\]*(?:\\.[^'\\]*)*')"  # string
    r"|(%[A-Za-z_][A-Za-z0-9_.\-]*)"  # name
    r"|([0-9bf?]{2,}_[0-9io?]{2,}->[0-9bf?]{2,}|[A-Za-z_][A-Za-z0-9_.\-]*)"  # dim labels (b01f_01io->b01f), identifier
    r"|(-?(?:\d[A-Za-z0-9_.]*(?:(?<=[eE])[+-]\d+)?|inf\b|nan\b))"  # number or number-like pattern
    r"|(->|<=|\.\.\.|[=,:*#+~?\[\]{}()<>@!|^&;$/\\-])"  # punctuation
    r"|(.)"  # anything else, one character
    r"|\Z)",
    re.S,
)

_COMMENT = re.compile(r"(\"[^\"\\]*(?:\\.[^\"\\]*)*\"|'[^'\\]*(?:\\.[^'\\]*)*')|/\*.*?\*/|//[^\n]*", re.S)


class Token(NamedTuple):
    """One token: its kind, its text span, and whether a line break separates it from the token before."""

    kind: int
    start: int
    end: int
    text: str
    line_start: bool

    @property
    def bare(self) -> str:
        """The text without a name's `%` sigil (names are spelled both ways)."""
        return self.text[1:] if self.kind == NAME else self.text


class Cursor:
    """Tokens of `text[pos:end]`, lexed lazily as the grammar asks for them (a computation's end is not
    known before it is read). `tokens` keeps every token lexed so far; `i` indexes the next one."""

    def __init__(self, text: str, pos: int = 0, end: int | None = None) -> None:
        self.text = text
        self.end = len(text) if end is None else end
        self.tokens: list[Token] = []
        self.i = 0
        self._match = _TOKEN.scanner(text, pos, self.end).match  # type: ignore[attr-defined]  # undocumented, stable
        self._first_on_line = pos == 0 or text[pos - 1] == "\n"
        self._done = pos >= self.end
        self._batch = 4

    def peek(self, ahead: int = 0) -> Token | None:
        """The token `ahead` places after the next one, or None past the end."""
        while len(self.tokens) <= self.i + ahead:
            if not self._lex():
                return None
        return self.tokens[self.i + ahead]

    def take(self) -> Token | None:
        """The next token, consumed."""
        token = self.peek()
        if token is not None:
            self.i += 1
        return token

    def offset(self) -> int:
        """Offset in the text of the next token (or of the end)."""
        token = self.peek()
        return token.start if token is not None else self.end

    def _lex(self) -> bool:
        """Lexes a batch of tokens, twice as many as last time (up to 512); False at the end."""
        if self._done:
            return False
        match, append, first, count = self._match, self.tokens.append, self._first_on_line, 0
        self._batch = batch = min(512, self._batch * 2)
        while count < batch:
            m = match()
            kind = m.lastindex if m is not None else None
            if m is None or kind is None or kind == 1:  # only trivia before the end
                self._done = True
                break
            append(Token(kind, m.start(kind), m.end(), m.group(kind), first or m.start(1) >= 0))
            first = False
            count += 1
        self._first_on_line = first
        return count > 0


def tokenize(text: str, start: int = 0, end: int | None = None) -> list[Token]:
    """Every token of `text[start:end]`; whitespace and comments are dropped but mark line breaks.

    A string or block comment that does not close before `end` is not a string or comment: its opening
    character becomes a punctuation token (XLA rejects such text; the grammar reports it).
    """
    cursor = Cursor(text, start, end)
    while cursor.peek(len(cursor.tokens)) is not None:
        pass
    return cursor.tokens


def line_of(text: str, offset: int) -> int:
    """1-based line number of an offset."""
    return text.count("\n", 0, offset) + 1


def decode(data: bytes | str) -> str:
    """Text from bytes of any encoding: UTF-8 where valid, U+FFFD for the rest (never raises)."""
    if isinstance(data, str):
        return data
    return data.decode("utf-8", errors="replace")


def clean(raw: str) -> str:
    """A value's or shape's spelling as both readers give it: the source text, comments removed, stripped."""
    if "/*" in raw or "//" in raw:
        raw = _COMMENT.sub(lambda m: m.group(1) or "", raw)
    return raw.strip()


def operand_name(raw: str) -> str:
    """An operand's name from its spelling: `f32[8]{0} %x` gives "x", `0` gives "0"."""
    words = clean(raw).split()
    return words[-1].removeprefix("%") if words else ""
