"""Ctrl-C (SIGINT) and SIGTERM anywhere: one line, no partial file, exit 130 within a second.

Python runs a signal handler only between bytecodes of the main thread, and the main thread of a dump
spends seconds at a time inside the compiler's native code; raising `KeyboardInterrupt` out of there (or
out of a garbage-collector callback) also aborts or crashes the native runtime. So the signal is taken
from a wakeup file descriptor instead: Python's C-level handler writes the signal's number to it the
moment the signal arrives, a daemon thread blocked on reading it wakes at once, removes the temporary
files of writes in flight (`atomic.write_atomic` registers them), stops the worker processes this one
started, prints one line and leaves with `os._exit(130)` — no unwinding through native frames, no
compiler output, no traceback.

Worker processes install the same handler silently: the terminal sends Ctrl-C to the whole process group,
and the parent, which speaks for them, prints the line. Ray workers (`--ray`) are actors this process owns:
Ray stops an owner's actors when the owner leaves, so they end with it and the cluster gets its CPUs back.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator

from shardscope.atomic import remove_pending_writes

EXIT_INTERRUPTED = 130
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_QUIET_TRACKER = "ignore:resource_tracker:UserWarning"


def exit_on_interrupt(message: str | None = "shardscope: interrupted") -> None:
    """From now on, SIGINT or SIGTERM ends this process at once with exit 130 and `message` (None: silent).

    Call it once, from the main thread, before any long work. A no-op where signals cannot be taken this way
    (not the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    # The resource tracker that process pools start (it inherits these options) would otherwise report the
    # pools' semaphores as leaked when this process leaves without unwinding; it still removes them.
    if _QUIET_TRACKER not in sys.warnoptions:
        sys.warnoptions.append(_QUIET_TRACKER)
    # The terminal's stderr as it is now: compiling redirects file descriptor 2 to capture the compiler's log.
    stderr = os.dup(2)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    for number in _SIGNALS:
        # The handler itself does nothing: the wakeup byte is what ends the process. It must not be the
        # default (which kills without cleanup) nor raise (which unwinds native code).
        signal.signal(number, _ignore)
    threading.Thread(target=_wait_and_exit, args=(read_end, stderr, message), name="interrupt", daemon=True).start()
    # A worker process starts with the signals its parent held while starting it (`signals_held`): one that
    # arrived meanwhile is pending, and is taken now, by the handler above.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Holds SIGINT and SIGTERM in this thread while it starts processes: a child inherits the held set, so a
    Ctrl-C that reaches it while Python is still starting (before it can install `exit_on_interrupt`) waits
    instead of ending it with a traceback. This process still takes the signal, on another of its threads
    (the wakeup byte does not care which)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _ignore(_number: int, _frame: object) -> None:
    return None


def _wait_and_exit(read_end: int, stderr: int, message: str | None) -> None:
    try:
        os.read(read_end, 1)
    except OSError:
        return
    remove_pending_writes()
    for child in multiprocessing.active_children():
        with contextlib.suppress(OSError):
            child.terminate()
    if message:
        with contextlib.suppress(OSError):
            os.write(stderr, (message + "\n").encode())
    os._exit(EXIT_INTERRUPTED)
