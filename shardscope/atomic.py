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
    """Fails early (before any compile) when `path` cannot be written: a directory or a device, under a
    file, or in a directory the OS refuses to write in (permissions, a read-only or full file system, /proc).

    Permissions alone cannot tell (root passes every permission check, and /proc refuses root too), so it
    writes as `write_atomic` would: a byte into a new file in the directory, or, where the directory does
    not exist yet, a new directory in the nearest one that does; both are removed at once.

    Raises:
      ShardscopeError: with what is in the way, in one line.
    """
    if path.is_dir():
        raise ShardscopeError(f"{what} {path} is a directory; give a file name, e.g. {path / 'plan.json'}")
    if path.exists() and not path.is_file():
        raise ShardscopeError(f"{what} {path} is not a regular file; give a file name (or - for standard output)")
    existing = next(parent for parent in path.parents if parent.exists())
    if not existing.is_dir():
        raise ShardscopeError(f"{what} {path}: {existing} is a file, not a directory")
    try:
        if existing == path.parent:
            fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=existing)
            try:
                # A full disk still creates an empty file; it refuses the first block written.
                os.write(fd, b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=f".{path.name}.", dir=existing))
    except OSError as err:
        raise ShardscopeError(f"{what} {path}: cannot write in {existing} ({err.strerror})") from None
