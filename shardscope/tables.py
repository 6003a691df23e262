"""Plans and diffs as pandas tables, for library users: what `shardscope table` prints, and one row per
tensor, collective row or change. Nothing inside the package imports this module."""

from shardscope.diff.frames import collective_changes_frame, tensor_changes_frame
from shardscope.plan.frames import GROUPINGS, collectives_frame, tensors_frame, traffic_by

__all__ = [
    "GROUPINGS",
    "collective_changes_frame",
    "collectives_frame",
    "tensor_changes_frame",
    "tensors_frame",
    "traffic_by",
]
