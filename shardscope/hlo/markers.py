"""The kernel-marker protocol: the named scopes a program puts around its stand-ins for TPU kernels.

A CPU compile cannot contain a TPU kernel (a Pallas call), so a program that runs one on the TPU runs a
stand-in elsewhere: plain JAX doing the kernel's matrix work. The cost model cannot tell such ops from any
other by their shapes, so the program says which they are, by a `jax.named_scope` whose name is one of
these markers (`shardscope.kernels` gives them as context managers). The markers are the cost model's only
reading of a name: no rule keys on a model's module, parameter or scope names.

- `ATTENTION`: an attention kernel's stand-in (a flash kernel: scores kept on chip). Its ops count their
  matrix FLOPs, priced at the kernel's efficiency, and no HBM bytes.
- `HALF_VISITED`: within `ATTENTION`, the matmuls of a sequence shard's queries against the keys of the
  other shards, which the stand-in writes against all of them under a mask and a load-balanced kernel
  visits half of on average: their FLOPs count half.
- `GROUPED_MATMUL`: the matmuls of a dropless MoE's experts run as a grouped-matmul kernel: priced at the
  kernel's efficiency.

A TPU program's own kernels need no marker: they are custom calls, known by their targets
(`shardscope.hlo.attention_kernels`, `shardscope.hlo.grouped_kernels`).
"""

from __future__ import annotations

__all__ = ["ATTENTION", "GROUPED_MATMUL", "HALF_VISITED", "MARKERS", "MARKER_PREFIX", "is_marker", "marked"]

MARKER_PREFIX = "shardscope.kernel."
ATTENTION = MARKER_PREFIX + "attention"
HALF_VISITED = MARKER_PREFIX + "half_visited"
GROUPED_MATMUL = MARKER_PREFIX + "grouped_matmul"
MARKERS = (ATTENTION, HALF_VISITED, GROUPED_MATMUL)


def is_marker(segment: str) -> bool:
    """Whether one segment of an op_name (a named scope) is a kernel marker: no module of the program."""
    return segment.startswith(MARKER_PREFIX)


def marked(op_name: str, marker: str) -> bool:
    """Whether an op_name lies in the marker's scope: one of its `/`-separated segments is the marker."""
    return marker in op_name.replace(";", "/").replace("(", "/").replace(")", "/").replace(":", "/").split("/")
