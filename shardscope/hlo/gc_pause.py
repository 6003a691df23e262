"""Python's cycle collector paused while a compiled module is read.

Reading a module allocates hundreds of thousands of small records (instructions, tuples, strings) that form
no reference cycles: reference counting frees them all. Each allocation burst still triggers the cycle
collector, and after a compile its full collections walk JAX's whole heap: about 40% of the time it takes
to read a small model's program. Paused, nothing the reader makes is kept longer than it would be anyway.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """The cycle collector off for the block, then as it was (a caller that turned it off keeps it off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
