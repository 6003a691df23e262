"""The collectives a CPU compile has that the TPU program of the same step does not.

XLA's CPU compiler partitions a top-k (the MoE router's choice of experts) by gathering its operand whole
over every axis that splits the tokens, once per MoE layer in each pass; the TPU compiler runs the top-k
on the split tokens, with no collective. Every TPU compile in the goldens and the published runs has no
such row, every CPU compile has them (up to a quarter of a 671B step's traffic). Prices of a CPU program
and predictions of the TPU program leave them out.
"""

from __future__ import annotations

from shardscope.plan.records import CollectiveRow

TOP_K = "top_k"  # the consumer op a router's top-k is named by in the compiled step's metadata


def cpu_only(row: CollectiveRow) -> bool:
    """Whether the row is a CPU compile's alone (a top-k's gather of its whole operand)."""
    return row.op == "all-gather" and row.cause is not None and row.cause.consumer.rsplit("/", 1)[-1] == TOP_K
