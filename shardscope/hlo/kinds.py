"""The kinds of work the cost model prices an op by (`shardscope.hlo.profile` says what each one is)."""

from __future__ import annotations

from enum import StrEnum


class WorkKind(StrEnum):
    """What an op of the compiled step does; its value is how the plan JSON's `work` spells it."""

    MATMUL = "matmul"  # matrix-unit work: a dot, a convolution, or a fusion containing one
    GROUPED = "grouped"  # the experts' matmuls of a dropless MoE run as a grouped-matmul kernel
    MEMORY = "memory"  # no matrix work: bytes only
    GATHER = "gather"  # a memory op that moves rows by index (a gather or a scatter)
    BUFFER = "buffer"  # bytes a TPU moves as counted (a materialised scatter buffer, a loop's accumulation)
    KERNEL = "kernel"  # inside an attention kernel: its FLOPs, not its bytes
    HOST = "host"  # a transfer between HBM and host memory


# Every kind, in the order the profile lists them.
KINDS = tuple(WorkKind)
