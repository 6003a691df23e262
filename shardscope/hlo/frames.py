"""Source lines of HLO instructions: the stack-frame tables a compiled module prints before its computations.

An instruction's metadata names a `stack_frame_id`; the `StackFrames` table gives each frame's file location
and parent frame, `FileLocations` each location's file and line, `FileNames` the file. The innermost frame
(the one the instruction names) is the model line that made the op: jax filters its own frames out of the
stack before lowering, so what is left is the user's code.
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
        found = _FRAME_ID.search(metadata or "")
        if found is None:
            return None
        frame = self.frames.get(int(found.group(1)))
        return None if frame is None else self.locations.get(frame[0])


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
