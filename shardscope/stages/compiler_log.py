"""What the XLA compiler writes to stderr while it compiles: captured, so that lints can read its warnings.

XLA's C++ code logs straight to file descriptor 2, below Python's `sys.stderr`, and reads its log level
(`TF_CPP_MIN_LOG_LEVEL`) once, when JAX is imported. So shardscope lowers that level to warnings *before* JAX
starts (`prepare_compiler_log`), captures descriptor 2 around each compile (`capture_compiler_log`), and
writes back only what the user asked to see: the level they had set, remembered in `SHOWN_LEVEL_ENV`
(shardscope's own default hides the compiler's warnings, as it always has). The warnings themselves become
findings (see `shardscope.lint.remat`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
# The compiler log level the user wants to see, as they set TF_CPP_MIN_LOG_LEVEL before shardscope lowered it.
SHOWN_LEVEL_ENV = "SHARDSCOPE_SHOWN_LOG_LEVEL"
WARNING = 1  # absl's levels: 0 info, 1 warning, 2 error, 3 fatal
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
# An absl log line: "W1123 02:44:33.431160   26390 spmd_partitioner.cc:656] ..."; before absl is initialised
# (JAX's CUDA plugin logs then) the seconds are since the epoch: "I0000 00:00:1795946538.060484 …".
_LOG_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\]]+\] ")
# What absl writes once before such lines: a note about logging, not a message of the compiler's.
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"

# The level XLA logs at in this process, when shardscope set it before JAX was imported.
_level_at_import: int | None = None


def _as_level(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def prepare_compiler_log(default_shown: int = 2) -> None:
    """Lets the compiler log warnings (so they can be captured) and remembers what the user wants shown.

    Call before JAX is imported; later it changes nothing (XLA has read its level by then).

    Args:
      default_shown: the level to show when the user set none (2: errors only, shardscope's default).
    """
    global _level_at_import
    if "jax" in sys.modules:
        return
    os.environ.setdefault(SHOWN_LEVEL_ENV, os.environ.get(LEVEL_ENV, str(default_shown)))
    level = min(_as_level(os.environ.get(LEVEL_ENV), WARNING), WARNING)
    os.environ[LEVEL_ENV] = str(level)
    _level_at_import = level
    if importlib.util.find_spec("jax_cuda12_plugin") is not None:
        # JAX's CUDA plugin (the GPU extra), loaded with JAX, logs at any level that it found no CUDA driver
        # (none is needed to compile): import JAX here, so that the line is shown only at the level asked for.
        with capture_compiler_log():
            import jax  # noqa: F401  # lazy: only where the GPU extra is installed


def warnings_visible() -> bool:
    """Whether the compiler's warnings reach stderr in this process (and so can be captured)."""
    if _level_at_import is not None:
        return _level_at_import <= WARNING
    # JAX itself defaults the level to 1 (warnings) when it is imported with none set.
    return _as_level(os.environ.get(LEVEL_ENV), WARNING) <= WARNING


def shown_level() -> int:
    """The lowest severity of compiler log lines written back to stderr after a capture."""
    return _as_level(os.environ.get(SHOWN_LEVEL_ENV), _as_level(os.environ.get(LEVEL_ENV), WARNING))


@dataclass
class CompilerLog:
    """What the compiler wrote during a capture (filled when the capture ends), and whether warnings could
    reach it at all."""

    visible: bool
    text: str = field(default="")


def echo_filter(text: str, level: int) -> str:
    """The lines of captured stderr to write back: log lines at `level` or above (with the lines that
    continue them), and everything that is not a compiler log line (a Python warning, say)."""
    kept: list[str] = []
    keep = True
    for line in text.splitlines(keepends=True):
        if line.startswith(_ABSL_PREAMBLE):
            continue
        match = _LOG_LINE.match(line)
        if match:
            keep = _SEVERITY[match.group(1)] >= level
        if keep:
            kept.append(line)
    return "".join(kept)


def _flush_stderr() -> None:
    for stream in {id(s): s for s in (sys.stderr, sys.__stderr__) if s is not None}.values():
        stream.flush()


@contextlib.contextmanager
def capture_compiler_log() -> Iterator[CompilerLog]:
    """Captures file descriptor 2 while the block runs; afterwards restores it, writes back what the user
    asked to see (`shown_level`), and restores TF_CPP_MIN_LOG_LEVEL to the user's own value for any child
    process.

    Yields:
      A CompilerLog whose `text` holds everything written to stderr during the block.
    """
    log = CompilerLog(visible=warnings_visible())
    _flush_stderr()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield log
        finally:
            _flush_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            log.text = sink.read().decode("utf-8", errors="replace")
            shown = echo_filter(log.text, shown_level())
            if shown:
                os.write(2, shown.encode("utf-8"))
            if SHOWN_LEVEL_ENV in os.environ and _level_at_import is not None:
                os.environ[LEVEL_ENV] = os.environ[SHOWN_LEVEL_ENV]
