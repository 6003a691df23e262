"""The token embedding's lookup: the table's rows each device's tokens read, and the table's gradient.

The table [vocab, embed] is split on its embedding dimension; each device holds some tokens. The
partitioner has two ways to look them up, and the compiled steps take the cheaper:
- move the tokens: gather the token ids over the axes that split the table, look each up in the local
  slice of the table, and send every token's slice back to the device that holds the token (an all-to-all
  of [tokens, embed]); the backward pass sends the rows' gradients the same way;
- move the table: gather it whole where it is used and, in the backward pass, sum each device's gradient
  of the whole table over the token axes (an all-reduce).
Both ways move the activations' dtype, forward and backward: the model casts the table to it before the
lookup, as MaxText does, so the table's gradient is summed in it and cast to the table's dtype once.
The first moves a device's tokens × the embedding, the second the table; XLA picks the smaller (the TPU
goldens: deepseek2-16b and llama3.1-8b move tokens, mixtral-8x7b on 256 chips moves the table).

When the tokens are also split over axes that do not split the table (a pipeline's stages, ep-as-dp's
expert axis as data), moving the tokens goes further (the goldens of both): the rows looked up over the
table's axes are gathered over those other axes too, and in the backward pass the activations' gradient
is gathered whole over every token axis (no all-to-all back), scattered into the table's local slice,
and that slice's gradient summed over the other axes; or, where the whole table is fewer bytes than every
token's gradient, the whole table's gradient is summed over every token axis instead (seed 003's ZeRO-1
run on v5p-8). Ids tiled over the devices in another order than the table (cp-as-ep: batch, then
context; the table: fsdp, context, expert) are gathered whole, every device looks every token up in its
slice, the rows are gathered over the table's axes, and the whole table's gradient is summed.
"""

from __future__ import annotations

import math

from shardscope.case.resolve import Case
from shardscope.case.rules import entry_axes
from shardscope.plan.document import Plan
from shardscope.plan.records import Cause, CollectiveRow
from shardscope.predict.layout import (
    collective_row,
    in_mesh_order,
    mesh_sizes,
    moved_dtype,
    nbytes,
)
from shardscope.predict.roles import lookup_table, module_of, token_ids

_IDS_DTYPE = "int32"


def _row(op: str, axes: tuple[str, ...], shape: tuple[int, ...], dtype: str, pass_: str, cause: Cause) -> CollectiveRow:
    # Named after the table's module, as a compiled row is after the lookup's.
    return collective_row(op, axes, shape, dtype, pass_, cause.consumer.rsplit("/", 1)[0], cause)


def _id_axes(plan: Plan, batch: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """The axes the looked-up token ids are split on, dimension by dimension: the token input's (a
    pipeline splits it over its stages too, where the activations inside are not), else the activations'
    token axes as one dimension."""
    ids = token_ids(plan)
    if ids is None:
        return (batch,)
    return tuple(axes for axes in (entry_axes(entry) for entry in ids.spec) if axes)


def _replicated_lookup(
    plan: Plan,
    ids: tuple[tuple[str, ...], ...],
    tokens: int,
    embed_axes: tuple[str, ...],
    moved: str,
    table: tuple[int, int],
    cause: Cause,
    grad: Cause,
) -> list[CollectiveRow]:
    """Every device looks up every token in its slice of the table: the ids gathered whole (one dimension's
    axes at a time, the last first), the looked-up rows gathered over the table's axes, and the whole
    table's gradient summed over each dimension's axes."""
    sizes = mesh_sizes(plan)
    rows: list[CollectiveRow] = []
    held = tokens
    for axes in reversed(ids):
        held *= math.prod(sizes[a] for a in axes)
        rows.append(_row("all-gather", in_mesh_order(plan, set(axes)), (held,), _IDS_DTYPE, "forward", cause))
    rows.append(_row("all-gather", embed_axes, (held, table[1]), moved, "forward", cause))
    rows += [_row("all-reduce", in_mesh_order(plan, set(axes)), table, moved, "backward", grad) for axes in ids]
    return rows


def lookup_collectives(plan: Plan, case: Case | None, tokens: int, batch: tuple[str, ...]) -> tuple[CollectiveRow, ...]:
    """The lookup's collectives (see the module doc); () without a split table. `tokens`: a device's tokens;
    `batch`: the token axes."""
    found = lookup_table(plan)
    if found is None or case is None:
        return ()
    path, table = found
    if len(table.shape) != 2:
        return ()
    sizes = mesh_sizes(plan)
    vocab_axes = in_mesh_order(plan, set(entry_axes(table.spec[0])))
    embed_axes = in_mesh_order(plan, set(entry_axes(table.spec[1])))
    vocab, embed = table.shape
    moved = moved_dtype(table.dtype, case.model.dtype)
    module = module_of(path)
    cause = Cause(tensors=(path,), consumer=f"{module}/gather", line=None, rules=())
    grad = Cause(tensors=(f"grads/{path}",), consumer=f"{module}/scatter-add", line=None, rules=())
    rows: list[CollectiveRow] = []
    if vocab_axes:
        # A vocabulary split: each device's slice of the table is gathered over it, and its gradient summed.
        local = (vocab, embed // math.prod(sizes[a] for a in embed_axes))
        rows += [
            _row("all-gather", vocab_axes, local, moved, "forward", cause),
            _row("all-reduce", vocab_axes, local, moved, "backward", grad),
        ]
    if not embed_axes:
        return tuple(rows)
    ways = math.prod(sizes[a] for a in embed_axes)
    if nbytes((tokens, embed), moved) < nbytes((vocab, embed), moved):
        ids = _id_axes(plan, batch)
        flat = tuple(axis for axes in ids for axis in axes)
        if flat[: len(embed_axes)] != embed_axes:
            # The ids are tiled over the devices in another order than the table: no all-to-all pairs them.
            lookup = _replicated_lookup(plan, ids, tokens, embed_axes, moved, table.shape, cause, grad)
            return (*rows, *lookup)
        rows += [
            _row("all-gather", embed_axes, (tokens * ways,), _IDS_DTYPE, "forward", cause),
            _row("all-to-all", embed_axes, (tokens, embed), moved, "forward", cause),
        ]
        other = in_mesh_order(plan, set(flat) - set(embed_axes) - set(vocab_axes))
        if not other:
            return (*rows, _row("all-to-all", embed_axes, (tokens, embed), moved, "backward", cause))
        others = math.prod(sizes[a] for a in other)
        every = in_mesh_order(plan, set(embed_axes) | set(other))
        rows.append(_row("all-gather", other, (tokens * ways * others, embed // ways), moved, "forward", cause))
        gathered = (tokens * ways * others, embed)
        if nbytes(gathered, moved) > nbytes(table.shape, moved):
            # Fewer bytes to sum the whole table's gradient than to gather every token's (seed 003's ZeRO-1).
            return (*rows, _row("all-reduce", every, table.shape, moved, "backward", grad))
        return (
            *rows,
            _row("all-gather", every, gathered, moved, "backward", grad),
            _row("all-reduce", other, (vocab, embed // ways), moved, "backward", grad),
        )
    rows.append(_row("all-gather", embed_axes, table.shape, moved, "forward", cause))
    summed = in_mesh_order(plan, set(batch) - set(vocab_axes))
    if summed:
        rows.append(_row("all-reduce", summed, table.shape, moved, "backward", grad))
    return tuple(rows)
