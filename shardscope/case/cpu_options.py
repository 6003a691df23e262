"""The CPU compiler's options that speed a plan's compile without changing its partitioned program, as this
jaxlib's compiler has them."""

from __future__ import annotations

import functools
import importlib.metadata
import re
from typing import Any


@functools.cache
def cpu_compiler_options() -> dict[str, Any]:
    """The CPU compiler's fast options (`resolve.compiler_options_for`) that this jaxlib's compiler has.

    XLA's classic loop emitters are gone from the CPU compiler of jaxlib 0.11, which refuses the option that
    chose them (`No such compile option`); there the fusion emitters are the only ones, and only the LLVM
    level is lowered. Read from the installed jaxlib's version, without starting JAX.
    """
    release = tuple(int(part) for part in re.findall(r"\d+", importlib.metadata.version("jaxlib"))[:2])
    if release >= (0, 11):
        return {"xla_backend_optimization_level": 0}
    return {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
