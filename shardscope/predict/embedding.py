"""The token embedding's lookup: the table's rows each device's tokens read, and the table's gradient.

The table [vocab, embed] is split on its embedding dimension; each device holds some tokens. The
partitioner has two ways to look them up, and the compiled steps take the cheaper:
- move the tokens: gather the token ids over the axes that split the table, look each up in the local
  slice of the table, and send every token's slice back to the device that holds the token (an all-to-all
  of [tokens, embed]); the backward pass sends the rows' gradients the same way, in the table's dtype;
- move the table: gather it whole where it is used (in the activations' dtype) and, in the backward pass,
  sum each device's gradient of the whole table over the token axes (an all-reduce, in the table's dtype).
The first moves a device's tokens × the embedding, the second the table; XLA picks the smaller (the TPU
goldens: deepseek2-16b and llama3.1-8b move tokens, mixtral-8x7b on 256 chips moves the table).
"""

from __future__ import annotations

import math

from shardscope.case.resolve import Case
from shardscope.case.rules import entry_axes
from shardscope.plan.document import Plan
from shardscope.plan.records import Cause, CollectiveRow
from shardscope.predict.layout import (
    LOOKUP_TABLE_LEAF,
    collective_row,
    in_mesh_order,
    mesh_sizes,
    moved_dtype,
    nbytes,
)

_IDS_DTYPE = "int32"
_SOURCE = "token_embedder"


def _row(op: str, axes: tuple[str, ...], shape: tuple[int, ...], dtype: str, pass_: str, cause: Cause) -> CollectiveRow:
    return collective_row(op, axes, shape, dtype, pass_, _SOURCE, cause)


def lookup_collectives(plan: Plan, case: Case | None, tokens: int, batch: tuple[str, ...]) -> tuple[CollectiveRow, ...]:
    """The lookup's collectives (see the module doc); () without a split table. `tokens`: a device's tokens;
    `batch`: the token axes."""
    found = next(
        ((path, r) for path, r in plan.tensors if r.kind == "param" and path.rsplit("/", 1)[-1] == LOOKUP_TABLE_LEAF),
        None,
    )
    if found is None or case is None:
        return ()
    path, table = found
    if len(table.shape) != 2:
        return ()
    sizes = mesh_sizes(plan)
    vocab_axes = in_mesh_order(plan, set(entry_axes(table.spec[0])))
    embed_axes = in_mesh_order(plan, set(entry_axes(table.spec[1])))
    vocab, embed = table.shape
    moved = moved_dtype(table.dtype, case)
    cause = Cause(tensors=(path,), consumer="token_embedder/gather", line=None, rules=())
    grad = Cause(tensors=(f"grads/{path}",), consumer="token_embedder/scatter-add", line=None, rules=())
    rows: list[CollectiveRow] = []
    if vocab_axes:
        # A vocabulary split: each device's slice of the table is gathered over it, and its gradient summed.
        local = (vocab, embed // math.prod(sizes[a] for a in embed_axes))
        rows += [
            _row("all-gather", vocab_axes, local, moved, "forward", cause),
            _row("all-reduce", vocab_axes, local, table.dtype, "backward", grad),
        ]
    if not embed_axes:
        return tuple(rows)
    ways = math.prod(sizes[a] for a in embed_axes)
    if nbytes((tokens, embed), moved) < nbytes((vocab, embed), moved):
        return (
            *rows,
            _row("all-gather", embed_axes, (tokens * ways,), _IDS_DTYPE, "forward", cause),
            _row("all-to-all", embed_axes, (tokens, embed), moved, "forward", cause),
            _row("all-to-all", embed_axes, (tokens, embed), table.dtype, "backward", cause),
        )
    rows.append(_row("all-gather", embed_axes, table.shape, moved, "forward", cause))
    summed = in_mesh_order(plan, set(batch) - set(vocab_axes))
    if summed:
        rows.append(_row("all-reduce", summed, table.shape, table.dtype, "backward", grad))
    return tuple(rows)
