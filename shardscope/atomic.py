"""Atomic file writes: a reader (or a killed writer) sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from shardscope.errors import ShardscopeError

# Temporary files of writes in flight: what an interrupt removes before the process ends (`interrupts`).
_PENDING: set[str] = set()


def remove_pending_writes() -> None:
    """Removes the temporary files of writes in flight (the targets keep their old content)."""
    for tmp in list(_PENDING):
        Path(tmp).unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Writes `text` to `path` through a temporary file in the same directory and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    _PENDING.add(tmp)
    umask = os.umask(0)
    os.umask(umask)
    try:
        # mkstemp creates 0600; a plan or report is as readable as any file the user writes.
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        _PENDING.discard(tmp)


def check_writable(path: Path, what: str = "output") -> None:
    """Fails early (before any compile) when `path` cannot be written: a directory, or under a file.

    Raises:
      ShardscopeError: with what is in the way.
    """

    if path.is_dir():
        raise ShardscopeError(f"{what} {path} is a directory; give a file name, e.g. {path / 'plan.json'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ShardscopeError(f"{what} {path}: {parent} is a file, not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ShardscopeError(f"{what} {path}: cannot write in {parent} (permission denied)")
            return
