"""Context parallelism's attention collectives: the sequence is split, and each query attends to every key.

Over the axes that split the keys' and values' length, each attention block gathers the keys and values
whole in the forward pass, and again in the remat's recompute. In the backward pass every query's
contribution to the whole keys' and values' gradients is reduce-scattered back to their shards, and the
compiled steps also gather the gradients of the split queries, keys and values whole over those axes (each
device's share of the score matmuls' transposes reads all of them).

Where the block reads its input whole over those axes (the attention's input rules leave the sequence
unsplit while the residual stream splits it), the input is gathered once per pass as well (forward, the
remat's recompute), and its gradient gathered whole in the backward pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from shardscope.case.rules import entry_axes
from shardscope.plan.document import Plan
from shardscope.plan.records import Cause, CollectiveRow, TensorRecord
from shardscope.predict.layout import Weight, collective_row, in_mesh_order, mesh_sizes, stack_of
from shardscope.predict.roles import Attention


def _length_axes(plan: Plan, record: TensorRecord) -> tuple[str, ...]:
    """The axes (size > 1) that split a [batch, length, …] activation's length."""
    return in_mesh_order(plan, set(entry_axes(record.spec[1]))) if len(record.spec) > 1 else ()


def _whole(record: TensorRecord, ways: int) -> tuple[int, ...]:
    """A device's share of the activation with its length gathered `ways` times."""
    return (record.shard_shape[0], record.shard_shape[1] * ways, *record.shard_shape[2:])


def context_attention(
    plan: Plan,
    every: tuple[Weight, ...],
    blocks: tuple[Attention, ...],
    remat: bool,
    operand: Callable[[str], str] = str,
    flash: bool = False,
) -> tuple[CollectiveRow, ...]:
    """Every attention block's context-parallel collectives (see the module doc). `operand`: the dtype a
    matmul operand moves as (the gathered keys and values feed the score and value matmuls). `flash`: the
    attention runs as the splash kernel on a TPU, or as its stand-in elsewhere, both with each device's
    queries against the keys and values gathered in a shard_map: the query, key and value gradients stay
    split, none is gathered."""
    sizes = mesh_sizes(plan)
    rows: list[CollectiveRow] = []
    for block in blocks:
        module, key = block.module, block.key[1]
        axes = _length_axes(plan, key)
        if not axes:
            continue
        ways = math.prod(sizes[a] for a in axes)
        stack = stack_of(module, every)
        count, trips = (stack.per_trip, stack.loop_trips) if stack is not None else (1, 1)
        wanted: list[tuple[str, str, str, str, tuple[int, ...]]] = []
        gathers = ("forward", "backward") if remat else ("forward",)
        for path, record in (block.key, block.value):
            if _length_axes(plan, record) == axes:
                whole = _whole(record, ways)
                wanted += [("all-gather", p, path, operand(record.dtype), whole) for p in gathers]
                # Every query's contribution to the whole keys' (values') gradient, summed back to its shard.
                wanted.append(("reduce-scatter", "backward", path, record.dtype, whole))
        for path, record in () if flash else (block.query, block.key, block.value):
            if _length_axes(plan, record) == axes:
                wanted.append(("all-gather", "backward", path, record.dtype, _whole(record, ways)))
        if block.inputs is not None and not set(axes) & set(_length_axes(plan, block.inputs[1])):
            # Read whole: its shard already has the whole length.
            path, inputs = block.inputs
            read = inputs.shard_shape
            wanted += [("all-gather", p, path, inputs.dtype, read) for p in (*gathers, "backward")]
        for op, pass_, path, dtype, shape in wanted:
            cause = Cause(tensors=(path,), consumer=f"{module}/attention", line=None, rules=())
            rows.append(collective_row(op, axes, shape, dtype, pass_, module, cause, count, trips))
    return tuple(rows)
