"""The activations' collectives: tensor parallelism's partial sums and gathers.

Tensor parallelism keeps a weight split over axes that do not split the tokens. Where such an axis splits
the dimensions a matmul contracts (the input features of an output projection, attention's or the MLP's:
its last dimension is the model's width), each device's output is a partial sum, added over the axis in the
forward pass (and again in the remat's recompute); where it splits only the output features (the MLP's
input projections, the query's), the forward output stays split and the backward pass's input gradient is
the partial sum. Either sum moves the tokens a device holds
times the features on the other side, in the activations' dtype.
"""

from __future__ import annotations

import math

from shardscope.case.rules import entry_axes
from shardscope.plan.document import Plan
from shardscope.plan.records import Cause, CollectiveRow, is_stack_name
from shardscope.predict.layout import (
    Weight,
    feature_dims,
    in_mesh_order,
    layer_row,
    mesh_sizes,
)
from shardscope.predict.roles import residual_stream

_REMAT_FORWARD = 1  # the recompute runs the forward sums once more


def _full_size(weight: Weight, dims: tuple[int, ...]) -> int:
    """Features of `dims` as the layer sees them whole (the per-layer shape without stack dimensions)."""
    shape = [s for s, n in zip(weight.record.shape, weight.record.logical or (), strict=False) if not is_stack_name(n)]
    if len(shape) != len(weight.layer_shape):
        shape = list(weight.layer_shape)
    return math.prod(shape[d] for d in dims)


def _split_axes(plan: Plan, weight: Weight, dims: tuple[int, ...]) -> tuple[str, ...]:
    """The kept axes (tensor-parallel) that split any of `dims`."""
    spec = [e for e, n in zip(weight.record.spec, weight.record.logical or (), strict=False) if not is_stack_name(n)]
    found: set[str] = set()
    for d in dims:
        if d < len(spec):
            entry = spec[d]
            found.update(() if entry is None else (entry,) if isinstance(entry, str) else entry)
    return in_mesh_order(plan, found & set(weight.kept_axes))


def tensor_parallel_sums(
    plan: Plan, every: tuple[Weight, ...], tokens: int, dtype: str, remat: bool
) -> tuple[CollectiveRow, ...]:
    """Tensor parallelism's activation collectives (see the module doc). An output projection's partial
    output is summed per weight, and so is an input gradient; the projections that share an input (those of
    one module: query, key and value; an MLP's two input projections) share its gather where the residual
    stream is split, once per group."""
    rows: list[CollectiveRow] = []
    groups: dict[tuple[str, tuple[str, ...], int], Weight] = {}
    sizes = mesh_sizes(plan)
    for weight in every:
        if weight.is_expert or not weight.kept_axes or len(weight.layer_shape) < 2:
            continue
        inputs, outputs = feature_dims(weight)
        contracted = _split_axes(plan, weight, inputs)
        if contracted:
            # The partial output, split over whichever kept axes split the output features.
            out_ways = math.prod(sizes[a] for a in _split_axes(plan, weight, outputs))
            shape = (tokens, max(1, _full_size(weight, outputs) // out_ways))
            passes = (("forward", 1), ("backward", _REMAT_FORWARD)) if remat else (("forward", 1),)
            rows += [_collective("all-reduce", weight, contracted, shape, dtype, p, n) for p, n in passes]
        split_out = tuple(a for a in _split_axes(plan, weight, outputs) if a not in contracted)
        if not split_out:
            continue
        shape = (tokens, _full_size(weight, inputs))
        residual = _residual_split(plan, weight) & set(split_out)
        if residual:
            parent = weight.module.rsplit("/", 1)[0]
            groups.setdefault((parent, in_mesh_order(plan, residual), shape[1]), weight)
        else:
            # Each projection's input gradient is partial and summed on its own: the partitioner sums a
            # matmul's partial output where the matmul is, before the siblings' gradients are added.
            rows.append(_collective("all-reduce", weight, split_out, shape, dtype, "backward", 1))
    for (_, over, features), weight in sorted(groups.items()):
        shape = (tokens, features)
        steps = [("all-gather", "forward"), ("reduce-scatter", "backward")]
        steps += [("all-gather", "backward")] if remat else []
        rows += [_collective(op, weight, over, shape, dtype, p, 1) for op, p in steps]
    return tuple(rows)


def _residual_split(plan: Plan, weight: Weight) -> set[str]:
    """The axes that split the features of the residual stream entering the weight's layer (MaxText's
    `activation_embed` rule): where they split it, a projection gathers its input over them first."""
    inputs = residual_stream(plan, "/".join(weight.module.split("/")[:2]))
    if inputs is None or not inputs.spec:
        return set()
    return set(entry_axes(inputs.spec[-1]))


def _collective(
    op: str, weight: Weight, axes: tuple[str, ...], shape: tuple[int, ...], dtype: str, pass_: str, count: int
) -> CollectiveRow:
    cause = Cause(tensors=(weight.path,), consumer=f"{weight.module}/dot_general", line=None, rules=())
    return layer_row(op, weight, axes, shape, dtype, pass_, cause, count)
