"""What a module's text left out, said in one line each: a file that ends inside a computation (XLA dumps
cut at N lines, as MaxText's reference dumps are), instructions that do not parse, stray text.

A reader of the collectives table needs to know when it is partial, and what part it covers.
"""

from __future__ import annotations

from shardscope.hlo.records import Module

__all__ = ["module_notices"]

_SHOWN = 5  # line numbers listed before "…"


def _line_numbers(text: str, offsets: list[int]) -> list[int]:
    out, line, last = [], 1, 0
    for at in sorted(offsets):
        line, last = line + text.count("\n", last, at), at
        out.append(line)
    return out


def _listed(lines: list[int]) -> str:
    shown = ", ".join(str(n) for n in lines[:_SHOWN])
    return shown + (f" and {len(lines) - _SHOWN} more" if len(lines) > _SHOWN else "")


def module_notices(module: Module) -> tuple[str, ...]:
    """One line per thing the text left out; () for a complete, well-formed module."""
    text = module.text
    notices: list[str] = []
    cut = module.truncation
    if cut is not None:
        total = text.count("\n") + (not text.endswith("\n"))
        header, *rest = _line_numbers(text, [cut.start] + ([cut.cut.offset] if cut.cut else []))
        whole = sum(c.complete for c in module.computations)
        last = f", the last one cut off at line {rest[0]}" if rest else ""
        notices.append(
            f"the text ends inside computation {cut.computation!r} (begun at line {header}; the text has {total}"
            f" lines): read {whole} computations in full and {cut.read} instructions of that one{last};"
            " collectives under computations whose callers were not read are counted once, loop trips unknown"
        )
    unclosed = [c for c in module.computations if not c.complete and (cut is None or c.start != cut.start)]
    if unclosed:
        lines = _line_numbers(text, [c.start for c in unclosed])
        names = ", ".join(repr(c.name) for c in unclosed[:_SHOWN])
        notices.append(f"computations not closed before the next one starts: {names} (lines {_listed(lines)})")
    malformed = [m.offset for c in module.computations if c.malformed for m in c.malformed]
    if malformed:
        lines = _line_numbers(text, malformed)
        notices.append(f"{len(malformed)} instruction(s) that do not parse were skipped (lines {_listed(lines)})")
    if module.skipped:
        lines = _line_numbers(text, list(module.skipped))
        notices.append(f"text between computations that is not HLO was skipped (lines {_listed(lines)})")
    return tuple(notices)
