"""User-facing errors: everything raised here becomes one line on stderr and exit code 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ShardscopeError(Exception):
    """An input the user can fix (a name, a file, a mesh). The CLI prints it as one line and exits 2."""


class UnknownNameError(ShardscopeError):
    """A model, preset, topology or case name that no registry knows."""


class PresetError(ShardscopeError):
    """A preset file that is malformed or inconsistent with its mesh."""


class MeshError(ShardscopeError):
    """A mesh that does not fit the devices, or names an axis the preset lacks."""


class ShardingError(ShardscopeError):
    """A tensor dimension that its mesh axes do not divide."""


class CompileError(ShardscopeError):
    """A case the compiler refuses for a reason the user can change (it does not fit in device memory)."""


class PlanError(ShardscopeError):
    """A plan or golden file that is corrupt or of a newer schema."""


def unknown_name(kind: str, name: str, known: Iterable[str]) -> UnknownNameError:
    """Builds the error for an unknown registry name, with the known names and a "did you mean".

    Args:
      kind: what was looked up ("model", "preset", ...).
      name: what the user wrote.
      known: every valid name.

    Returns:
      An UnknownNameError ready to raise.
    """
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return UnknownNameError(f"unknown {kind} {name!r}{hint} (known: {', '.join(known)})")
