"""Source lines of HLO instructions: the stack-frame tables a compiled module prints before its computations.

An instruction's metadata names a `stack_frame_id`; the `StackFrames` table gives each frame's file location
and parent frame, `FileLocations` each location's file and line, `FileNames` the file. A frame's printed
`parent_frame_id` is one more than its parent's id (0: no parent, so the outermost frame reads as its own
parent). jax leaves its own frames out; which library frames are left in depends on where the libraries are
installed, so callers pick the innermost frame of the stack (`chain_of`) that is model code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SourceFrames", "source_frames"]

_TABLE_RE = re.compile(r"^(FileNames|FunctionNames|FileLocations|StackFrames)[ \t]*\n", re.MULTILINE)
_STRING_ENTRY = re.compile(r'^[ \t]*(\d+)[ \t]+"((?:[^"\\\n]|\\.)*)"[ \t]*$', re.MULTILINE)
_FIELD_ENTRY = re.compile(r"^[ \t]*(\d+)[ \t]+\{([^{}\n]*)\}[ \t]*$", re.MULTILINE)
_FIELD = re.compile(r"(\w+)=(\d+)")
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")


@dataclass(frozen=True)
class SourceFrames:
    """The module's frames: file location id and parent of each frame; file name and line of each location."""

    frames: dict[int, tuple[int, int]]
    locations: dict[int, tuple[str, int]]

    def line_of(self, metadata: str | None) -> tuple[str, int] | None:
        """(file, line) of the innermost frame an instruction's metadata names; None without one."""
        chain = self.chain_of(metadata)
        return chain[0] if chain else None

    def chain_of(self, metadata: str | None) -> tuple[tuple[str, int], ...]:
        """(file, line) of every frame of the stack an instruction's metadata names, innermost first."""
        found = _FRAME_ID.search(metadata or "")
        frame_id = int(found.group(1)) if found else 0
        out: list[tuple[str, int]] = []
        seen: set[int] = set()
        while frame_id in self.frames and frame_id not in seen:
            seen.add(frame_id)
            location, parent = self.frames[frame_id]
            if location in self.locations:
                out.append(self.locations[location])
            frame_id = parent - 1
        return tuple(out)


def source_frames(text: str) -> SourceFrames:
    """Reads the tables at the head of a module's text (an empty `SourceFrames` if it has none)."""
    head_end = text.find("\nENTRY ")
    first = text.find("\n%")
    ends = [e for e in (head_end, first) if e >= 0]
    head = text[: min(ends)] if ends else text
    tables: dict[str, str] = {}
    marks = list(_TABLE_RE.finditer(head))
    for at, mark in enumerate(marks):
        body_end = marks[at + 1].start() if at + 1 < len(marks) else len(head)
        tables[mark.group(1)] = head[mark.end() : body_end]
    files = {int(i): name.replace('\\"', '"') for i, name in _STRING_ENTRY.findall(tables.get("FileNames", ""))}
    locations: dict[int, tuple[str, int]] = {}
    for i, fields in _FIELD_ENTRY.findall(tables.get("FileLocations", "")):
        values = {k: int(v) for k, v in _FIELD.findall(fields)}
        if values.get("file_name_id") in files and "line" in values:
            locations[int(i)] = (files[values["file_name_id"]], values["line"])
    frames: dict[int, tuple[int, int]] = {}
    for i, fields in _FIELD_ENTRY.findall(tables.get("StackFrames", "")):
        values = {k: int(v) for k, v in _FIELD.findall(fields)}
        if "file_location_id" in values:
            frames[int(i)] = (values["file_location_id"], values.get("parent_frame_id", 0))
    return SourceFrames(frames, locations)
