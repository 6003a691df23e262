"""What comes before an HLO module's computations: the `HloModule name, attributes…` line and the tables
XLA prints after it (`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`: numbered strings or
`{…}` records that metadata refers to by id).

Only the module's name and device counts (`num_partitions`, `replica_count`) are used; the tables are
skipped, but as tokens, so that a `{` or a quote in a file name cannot be taken for the first computation.
"""

from __future__ import annotations

import re

from shardscope.hlo.text import NAME, NUMBER, PUNCT, STRING, WORD, Cursor, Token, clean

__all__ = ["TABLE_KEYWORDS", "read_module_header", "skip_line", "skip_table"]

TABLE_KEYWORDS = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})
# A dump's table entries, one a line: `1 "file.py"` or `1 {file_location_id=1 frame_id=0}`.
_TABLE_LINES = re.compile(
    r"(?:[ \t]*\n|[ \t]*\d+[ \t]+(?:\"[^\"\\\n]*(?:\\.[^\"\\\n]*)*\"|\{[^{}\n]*\})[ \t]*(?:\n|\Z))*"
)


def _is(token: Token | None, text: str) -> bool:
    return token is not None and token.kind == PUNCT and token.text == text


def _skip_value(c: Cursor, stop_at_line: bool) -> None:
    """Consumes a value: up to a `,` outside brackets, or (if `stop_at_line`) a token starting a line, or
    (else) the bracket that closes the one the value opened with."""
    depth = 0
    first = c.i
    while (token := c.peek()) is not None:
        if not depth and c.i > first and (_is(token, ",") or (stop_at_line and token.line_start)):
            return
        if token.kind == PUNCT and token.text in "([{":
            depth += 1
        elif token.kind == PUNCT and token.text in ")]}":
            depth -= 1
            if depth <= 0 and not stop_at_line:
                c.take()
                return
            depth = max(0, depth)
        c.take()


def read_module_header(text: str, start: int) -> tuple[str, tuple[tuple[str, str], ...], int]:
    """`HloModule name, attributes…` at `start` → (name, attributes, offset after them).

    A value ends at a `,` outside brackets or with its line (the header is one line in every dump).
    """
    c = Cursor(text, start)
    c.take()  # HloModule
    name = c.peek()
    if name is None or name.line_start or name.kind not in (NAME, WORD, STRING):
        return "", (), c.tokens[0].end
    c.take()
    attributes: list[tuple[str, str]] = []
    while _is(c.peek(), ","):
        key, eq = c.peek(1), c.peek(2)
        if key is None or eq is None or key.kind != WORD or not _is(eq, "="):
            break
        c.take(), c.take(), c.take()
        first = c.i
        _skip_value(c, stop_at_line=True)
        if c.i > first:
            attributes.append((key.text, clean(text[c.tokens[first].start : c.tokens[c.i - 1].end])))
    return name.bare.strip("\"'"), tuple(attributes), c.tokens[c.i - 1].end


def skip_table(text: str, start: int) -> int:
    """Skips a table (its keyword, then `int "string"` or `int {…}` entries): a regex takes the one-line
    entries a dump prints (tables run to 100,000s of lines), the tokens whatever is left."""
    keyword_end = text.find("\n", start)
    if keyword_end < 0:
        return len(text)
    end = _TABLE_LINES.match(text, keyword_end + 1).end()  # type: ignore[union-attr]  # `*`: always matches
    c = Cursor(text, end)
    while True:
        token, nxt = c.peek(), c.peek(1)
        if token is None or token.kind != NUMBER or nxt is None or not (nxt.kind == STRING or _is(nxt, "{")):
            return end
        c.take()
        if nxt.kind == STRING:
            c.take()
        else:
            _skip_value(c, stop_at_line=False)
        end = c.tokens[c.i - 1].end


def skip_line(text: str, start: int) -> int:
    """The start of the line after the one holding `start`."""
    end = text.find("\n", start)
    return len(text) if end < 0 else end + 1
