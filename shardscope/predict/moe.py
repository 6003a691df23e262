"""The MoE token all-to-alls of the all_to_all strategy (`reference_models/moe.py` `all_to_all_body`).

Each device puts its tokens into per-expert slots [experts, capacity, embed] and exchanges them with the
devices that hold those experts, over the expert-parallel axes that also split the tokens; the experts'
outputs come back the same way: 2 all-to-alls per MoE layer forward, and in the backward pass 4 (the
remat's recomputed 2, and their transposes). Each expert has the capacity the model's capacity factor gives
a device's tokens (dropless, every local token, without one: the tiny models).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from shardscope.case.resolve import Case
from shardscope.case.rules import Rule, entry_axes
from shardscope.plan.document import Plan
from shardscope.plan.records import Cause, CollectiveRow, TensorRecord, expert_dim
from shardscope.predict.layout import (
    Weight,
    capacity,
    in_mesh_order,
    is_output_projection,
    layer_row,
    sequence_length,
)
from shardscope.predict.roles import block_input, embed_width, expert_layout
from shardscope.predict.rules import rules_on


@dataclass(frozen=True)
class _Block:
    """One MoE block (the module holding expert weights) as the prediction reads it."""

    module: str
    weight: Weight  # one of its expert weights (its stack and kept axes)
    inputs_path: str
    inputs: TensorRecord  # the tokens entering the block
    split_tokens: frozenset[str]  # the axes that split them (any token dimension)
    local_tokens: int  # a device's tokens


def _blocks(plan: Plan, experts: tuple[Weight, ...]) -> list[_Block]:
    """Each MoE block with its recorded inputs, in module order."""
    found = []
    for module in sorted({w.module for w in experts}):
        weight = next(w for w in experts if w.module == module)
        width = embed_width(weight.record)
        recorded = block_input(plan, module, width) if width is not None else None
        if recorded is None:
            continue
        inputs_path, inputs = recorded
        split = frozenset(axis for entry in inputs.spec[:-1] for axis in entry_axes(entry))
        found.append(_Block(module, weight, inputs_path, inputs, split, math.prod(inputs.shard_shape[:-1])))
    return found


def moe_exchanges(
    plan: Plan,
    experts: tuple[Weight, ...],
    rules: tuple[Rule, ...],
    remat: bool,
    case: Case | None = None,
    operand: Callable[[str], str] = str,
) -> tuple[CollectiveRow, ...]:
    """The all-to-alls of each MoE block (the module holding expert weights), per pass. `operand`: the dtype
    a matmul operand moves as (see the comment in the body for which exchange moves what)."""
    rows: list[CollectiveRow] = []
    for block in _blocks(plan, experts):
        module, weight, inputs_path, inputs = block.module, block.weight, block.inputs_path, block.inputs
        if weight.record.logical is None:
            continue
        # Tokens travel over the axes that split both the experts and the tokens.
        exchange = in_mesh_order(plan, set(weight.kept_axes) & block.split_tokens)
        if not exchange:
            continue  # experts not split, or split on axes that do not split the tokens: no exchange
        num_experts = weight.record.shape[expert_dim(weight.record)]
        local_tokens = block.local_tokens
        slots = (num_experts, capacity(local_tokens, case, sequence_length(inputs)), inputs.shape[-1])
        cause = Cause(
            tensors=(inputs_path,),
            consumer=f"{module}/all_to_all",
            line=None,
            rules=rules_on(plan, inputs_path, inputs, exchange, rules),
        )
        # The tokens sent feed the experts' matmuls and the outputs coming back feed the combine's weighted
        # sum (an einsum): both move as matmul operands, as does the outputs' gradient going out; the
        # tokens' gradient coming back is a matmul's result, in the activations' dtype.
        moved, gradient = operand(inputs.dtype), inputs.dtype
        passes = [("forward", moved), ("forward", moved), ("backward", moved), ("backward", gradient)]
        if remat:
            passes += [("backward", moved), ("backward", moved)]
        for (pass_, dtype), count in Counter(passes).items():
            rows.append(layer_row("all-to-all", weight, exchange, slots, dtype, pass_, cause, count, module))
    return tuple(rows)


def expert_token_sums(plan: Plan, experts: tuple[Weight, ...], case: Case | None) -> tuple[CollectiveRow, ...]:
    """The sums of each MoE block's outputs over the expert axes that do not split the tokens (the body's
    `sum_axes`): every device there holds the same tokens and runs only its own experts on them, so the
    combined output [tokens, embed] is added over those axes in the forward pass; the backward pass adds the
    tokens' gradients, one per (token, choice), over them (the shard_map's replicated input). The remat
    keeps the forward sum's output, as the compiled steps show (no recomputed sum)."""
    rows: list[CollectiveRow] = []
    for block in _blocks(plan, experts):
        module, weight, inputs_path, inputs = block.module, block.weight, block.inputs_path, block.inputs
        axes = in_mesh_order(plan, set(weight.kept_axes) - block.split_tokens)
        if not axes:
            continue
        local_tokens = block.local_tokens
        choices = case.model.num_experts_per_token if case is not None and case.model.num_experts else 1
        cause = Cause(tensors=(inputs_path,), consumer=f"{module}/psum", line=None, rules=())
        for pass_, tokens in (("forward", local_tokens), ("backward", local_tokens * choices)):
            shape = (tokens, inputs.shape[-1])
            rows.append(layer_row("all-reduce", weight, axes, shape, inputs.dtype, pass_, cause, 1, module))
    return tuple(rows)


def expert_partial_sums(
    plan: Plan, experts: tuple[Weight, ...], remat: bool, slots_of: Callable[[Weight], int]
) -> tuple[CollectiveRow, ...]:
    """The sums of each MoE block's slot outputs over the axes that split the experts' hidden dimension
    (tensor parallelism inside the experts): each device's output projection contracts only its share of the
    hidden features, so the slots [local experts, slots, embed] are summed over those axes in the forward
    pass; in the backward pass the input gradient of the input projections is partial too (and the remat
    sums once more).
    `slots_of`: the slots each local expert runs on (`predict.work`)."""
    rows: list[CollectiveRow] = []
    for weight in experts:
        if not is_output_projection(weight) or len(weight.layer_shape) < 3:
            continue
        placed = expert_layout(plan, weight.module, weight.record)
        spec = placed.spec if placed is not None and len(placed.spec) == 3 else None
        hidden = set(entry_axes(spec[1])) if spec is not None else set()
        axes = in_mesh_order(plan, hidden)
        if not axes:
            continue
        shape = (weight.layer_shape[0], slots_of(weight), weight.layer_shape[-1])
        width = embed_width(weight.record)
        inputs = block_input(plan, weight.module, width) if width is not None else None
        dtype = inputs[1].dtype if inputs is not None else weight.record.dtype
        cause = Cause(tensors=(weight.path,), consumer=f"{weight.module}/psum", line=None, rules=())
        backward = 2 + (1 if remat else 0)
        for pass_, count in (("forward", 1), ("backward", backward)):
            rows.append(layer_row("all-reduce", weight, axes, shape, dtype, pass_, cause, count))
    return tuple(rows)
