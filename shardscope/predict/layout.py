"""The facts of a tensors-only plan a prediction reads: mesh order, data-parallel axes, each weight's layers.

A weight (kind "param") is stacked over layers by a dimension whose logical name ends in "layers"
(`layers`, `moe_layers`, `dense_layers`); the scan runs once per layer, so a per-layer collective executes
that dimension's size times. An expert dimension (logical `exp`) keeps its shards: tokens travel to the
experts, not the experts to the tokens.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from shardscope.case.resolve import Case, resolve_case
from shardscope.case.rules import entry_axes
from shardscope.errors import ShardscopeError
from shardscope.plan.document import Plan
from shardscope.plan.records import (
    Cause,
    CollectiveRow,
    TensorRecord,
    expert_dim,
    is_lookup_table,
    is_routed_expert,
    is_stack_name,
)
from shardscope.predict.roles import (
    Attention,
    attention_blocks,
    attention_modules,
    checkpoint_names,
    chosen,
    expert_layout,
    layer_tokens,
    module_of,
    sequence_parallel_axes,
    token_ids,
    tokens_first,
)

# Activation dimensions that split the tokens: a weight used by split tokens is gathered whole over those axes
# (FSDP), and its gradient is partial per device and summed over them.
_TOKEN_WORDS = ("batch", "length")


@dataclass(frozen=True)
class Weight:
    """One parameter as the scan sees it: the per-layer slice each layer gathers and differentiates."""

    path: str  # "params/decoder/layers/mlp/wi_0/kernel"
    module: str  # "decoder/layers/mlp/wi_0": the path without `params/` and the leaf, as compiled rows' source
    record: TensorRecord
    loop_trips: int  # layers of its stack (1 when not stacked)
    layer_shape: tuple[int, ...]  # per-layer shape: stack dims dropped, expert dims at their shard size
    gathered_axes: tuple[str, ...]  # mesh order: the axes (size > 1) each layer gathers it over
    kept_axes: tuple[str, ...]  # mesh order: the axes it stays split on where a layer uses it (experts, TP)
    stack_axes: tuple[str, ...]  # mesh order: the axes its layer dims are split on (pipeline stages)
    # Layers of the stack each loop trip runs: 1, but in a pipeline, whose loop runs once per iteration
    # (microbatches × repeats + stages − 1, the bubble included) over the layers of one repeat of a stage.
    per_trip: int = 1
    # The same slice at every trip of its loop (a one-visit pipeline's stage layer, which MaxText's layout
    # keeps as a weight of its own): the compiler moves its gathers out of the loop, once per step.
    invariant: bool = False
    # Layers of the stack this device holds (a pipeline stage's: every visit's).
    held_layers: int = 1
    # The name its matmul's output carries for the remat policies (`roles.CHECKPOINTS`; None: none).
    checkpoint: str | None = None
    # A projection of an attention block (in a submodule of the block's).
    in_attention: bool = False
    # The activation it multiplies where the plan records it: an attention projection's block input.
    reads: TensorRecord | None = None

    @property
    def stacked(self) -> bool:
        """Part of a layer stack (it has a layers dimension): what the scan runs, and the remat recomputes."""
        return any(is_stack_name(name) for name in self.record.logical or ())

    @property
    def is_expert(self) -> bool:
        """A MoE routed expert weight (`plan.records.is_routed_expert`)."""
        return is_routed_expert(self.path, self.record)


def resolved(plan: Plan) -> Case | None:
    """The plan's case resolved again (model config, pipeline); None when it no longer resolves."""
    record = plan.case
    try:
        return resolve_case(
            record.model,
            record.preset_source or record.preset,
            record.topology,
            dict(record.mesh),
            dict(record.overrides),
        )
    except (ShardscopeError, OSError, ValueError):
        return None


def device_tokens(plan: Plan) -> int:
    """Tokens (batch × sequence) a device holds where a layer uses them: the token ids' shard
    (`roles.token_ids`)."""
    tokens = token_ids(plan)
    if tokens is None or not tokens.shard_shape:
        return 1
    return math.prod(tokens.shard_shape)


def microbatch_tokens(case: Case | None, tokens: int, sizes: dict[str, int], batch_axes: tuple[str, ...]) -> int:
    """Tokens of one microbatch a device holds in a pipeline: the microbatch's sequences split over the
    batch axes where they divide them, else held whole (every device of the stage runs them)."""
    if case is None or case.preset.pipeline is None:
        return tokens
    sequences = max(1, case.global_batch // case.preset.pipeline.microbatches)
    # Inside the pipeline the stage axis splits no batch (outside it, layers the pipeline does not run use it
    # as a data axis, which puts it among the token axes).
    ways = math.prod(sizes[a] for a in batch_axes if a != case.preset.pipeline.stage_axis)
    if ways > 1 and sequences % ways == 0:
        sequences //= ways
    return sequences * case.model.seq_len


def capacity(tokens: int, case: Case | None, seq: int | None = None) -> int:
    """Slots per expert for `tokens` candidate tokens in sequences of `seq` (the MoE body's: per sequence
    in MaxText's dense MoE, `row_capacity`; else over all of them, `_capacity`)."""
    if case is None or case.model.capacity_factor is None or not case.model.num_experts:
        return tokens
    k, experts, factor = case.model.num_experts_per_token, case.model.num_experts, case.model.capacity_factor
    if seq and dense_dispatch(case):
        # lazy: reference_models imports JAX, which only a prediction needs here
        from reference_models.moe import row_capacity

        return max(1, tokens // seq) * row_capacity(seq, k, experts, factor)
    return max(1, min(tokens, math.ceil(tokens * k / experts * factor)))


def sequence_length(tokens: TensorRecord | None) -> int | None:
    """A device's sequence length in a [batch, sequence, embed] activation (None for another shape)."""
    return tokens.shard_shape[1] if tokens is not None and len(tokens.shard_shape) == 3 else None


def dense_dispatch(case: Case | None) -> bool:
    """Whether the case's MoE dispatches as MaxText's dense MoE (a capacity factor, no grouped kernel):
    per-sequence capacity, tokens carried into slots and back by one-hot matmuls."""
    return case is not None and case.model.capacity_factor is not None and case.model.expert_matmul != "grouped"


def moved_dtype(weight_dtype: str, dtype: str | None) -> str:
    """The dtype a weight's gather and gradient sum move: the model casts its weights to the activations'
    dtype (`dtype`: `activation_dtype`) where a layer uses them, and the compiler moves that cast before the
    collective (on TPU and CPU alike), so a narrower activation dtype is what travels."""
    if dtype is None:
        return weight_dtype
    return dtype if nbytes((1,), dtype) < nbytes((1,), weight_dtype) else weight_dtype


def activation_dtype(plan: Plan, case: Case | None) -> str | None:
    """The activations' dtype: the case's model's, or where the case does not resolve here (a `maxtext:`
    model without MaxText), the dtype the plan records its layers' activations [batch, length, …] in; None
    without either."""
    if case is not None:
        return case.model.dtype
    found = chosen(
        (path, record)
        for path, record in plan.tensors
        if record.kind == "activation" and len(record.shape) >= 3 and tokens_first(record)
    )
    return found[1].dtype if found is not None else None


def dot_operand_dtype(dtype: str) -> str:
    """What a float32 matmul weight with head or expert dimensions moves as in a TPU program: at the default
    precision the TPU multiplies float32 in one bfloat16 pass, and its compiler narrows such operands before
    gathering them. Only float32 models see it (a bfloat16 model moves bfloat16 already); in the TPU goldens
    of float32 models the rank-3 weights (heads, experts) are gathered as bfloat16 and most rank-2
    projections as float32, their gradients summed in float32."""
    return "bfloat16" if dtype == "float32" else dtype


def mesh_sizes(plan: Plan) -> dict[str, int]:
    """Mesh axis → size, in mesh order."""
    return dict(plan.case.mesh)


def in_mesh_order(plan: Plan, axes: set[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`axes` without size-1 axes (they split nothing, and compiled rows never name them), in mesh order."""
    return tuple(axis for axis, size in plan.case.mesh if axis in axes and size > 1)


def token_axes(plan: Plan) -> tuple[str, ...]:
    """The mesh axes the activations' batch and sequence dimensions are split on: the data- and
    context-parallel axes, over which each device computes a partial weight gradient that must be summed."""
    found: set[str] = set()
    # Where the activations are not recorded (a pipelined placement: `advise.template`), the token inputs
    # are split like the batch they feed.
    kind = "activation" if any(r.kind == "activation" for _, r in plan.tensors) else "input"
    for _, record in plan.tensors:
        if record.kind != kind or record.logical is None:
            continue
        for logical, entry in zip(record.logical, record.spec, strict=False):
            if logical is not None and any(word in logical for word in _TOKEN_WORDS):
                found.update(entry_axes(entry))
    return in_mesh_order(plan, found)


def weight(plan: Plan, path: str, record: TensorRecord, tokens: tuple[str, ...], case: Case | None = None) -> Weight:
    """The per-layer view of one parameter. Over the token axes it is gathered; over other axes (tensor
    parallelism) it stays split, as do expert dimensions: from the recorded MoE layout where there is one."""
    logical = record.logical or (None,) * len(record.shape)
    trips, layer_shape = 1, []
    split: set[str] = set()
    kept: set[str] = set()
    stack: set[str] = set()
    # ZeRO-1 may store a stack split over its axis on the layers dimension: gathered back, not a stage split.
    zero1 = set(zero1_axes(plan, case))
    routed = is_routed_expert(path, record)
    per_dim = zip(logical, record.shape, record.spec, record.shard_shape, strict=False)
    for index, (name, size, entry, local) in enumerate(per_dim):
        axes = set(entry_axes(entry))
        if is_stack_name(name):
            # A stage-sharded stack: each stage loops over its own layers only.
            stored = axes & zero1
            trips *= local * math.prod(dict(plan.case.mesh).get(a, 1) for a in stored) if axes else size
            stack |= axes - stored
            split |= stored
            continue
        split |= axes
        dim_kept = axes if routed and index == expert_dim(record) else axes - set(tokens)
        kept |= dim_kept
        layer_shape.append(size if not dim_kept else local if dim_kept == axes else -1)
    # The layout the MoE body uses an expert weight in, as the plan records it: its spec names the axes that
    # stay split.
    placed = expert_layout(plan, module_of(path), record) if routed else None
    if placed is not None and len(placed.shape) == len(layer_shape):
        kept = {axis for entry in placed.spec for axis in entry_axes(entry)}
        layer_shape = list(placed.shard_shape)
    elif -1 in layer_shape:
        sizes = dict(plan.case.mesh)
        dims = [d for d, name in enumerate(logical) if not is_stack_name(name)]
        layer_shape = [
            -(-record.shape[d] // math.prod(sizes[a] for a in entry_axes(record.spec[d]) if a in kept)) for d in dims
        ]
    held = trips  # layers of the stack this device holds
    trips, per_trip = pipeline_trips(trips, stack, case, dict(plan.case.mesh))
    pipeline = case.preset.pipeline if case is not None and stack else None
    return Weight(
        path=path,
        module=module_of(path),
        record=record,
        loop_trips=trips,
        per_trip=per_trip,
        layer_shape=tuple(layer_shape),
        gathered_axes=in_mesh_order(plan, split - kept),
        kept_axes=in_mesh_order(plan, kept),
        stack_axes=in_mesh_order(plan, stack),
        invariant=pipeline is not None and pipeline.repeats == 1 and held == 1,
        held_layers=held,
    )


def zero1_axes(plan: Plan, case: Case | None) -> tuple[str, ...]:
    """ZeRO-1's axis (`shard_optimizer_over`) where it splits anything: the step gathers every weight back
    over it once, before the model runs."""
    over = case.preset.shard_optimizer_over if case is not None else None
    return (over,) if over is not None and dict(plan.case.mesh).get(over, 1) > 1 else ()


def pipeline_trips(layers: int, stack: set[str], case: Case | None, sizes: dict[str, int]) -> tuple[int, int]:
    """(loop trips, layers per trip) of a stack of `layers` layers per device: a pipeline's iterations over
    one repeat's layers where the stack is split over stages, else (layers, 1)."""
    pipeline = case.preset.pipeline if case is not None else None
    if pipeline is None or not stack:
        return layers, 1
    stages = math.prod(sizes[a] for a in stack)
    repeats = max(1, pipeline.repeats)
    iterations = pipeline.microbatches * repeats + stages - 1
    return iterations, max(1, layers // repeats)


def feature_dims(weight: Weight) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input, output) dimension indexes of the per-layer weight: an output projection (its last dimension
    is the model's embedding) contracts every other dimension; any other contracts its first."""
    logical = [n for n in (weight.record.logical or (None,) * len(weight.record.shape)) if not is_stack_name(n)]
    dims = tuple(range(len(weight.layer_shape)))
    last = logical[-1] if logical else None
    if last is not None and "embed" in last and len(dims) > 1:
        return dims[:-1], dims[-1:]
    return dims[:1], dims[1:]


def is_output_projection(weight: Weight) -> bool:
    """Whether the weight is an output projection: its last dimension is the model's width (`feature_dims`)."""
    logical = [n for n in (weight.record.logical or ()) if not is_stack_name(n)]
    return bool(logical) and logical[-1] is not None and "embed" in logical[-1] and len(weight.layer_shape) > 1


def stack_of(module: str, every: tuple[Weight, ...]) -> Weight | None:
    """A weight of the layer stack `module` belongs to (its loop trips and pipeline stages)."""
    for weight in every:
        if weight.module.startswith(module + "/") or weight.module == module:
            return weight
    head = module.split("/")
    for weight in every:
        parts = weight.module.split("/")
        if parts[:2] == head[:2] and weight.loop_trips > 1:
            return weight
    return None


def weights(
    plan: Plan,
    case: Case | None = None,
    tokens: tuple[str, ...] | None = None,
    blocks: tuple[Attention, ...] | None = None,
) -> tuple[Weight, ...]:
    """Every parameter of the plan but lookup tables (read by a gather of the looked-up rows, never gathered
    whole nor all-reduced: `predict.embedding`), in the plan's order (`case`: the plan's, resolved, for its
    pipeline; `tokens`: its `token_axes` when known; `blocks`: its `attention`, when known); with what each
    is to its block (`predict.roles`)."""
    tokens = token_axes(plan) if tokens is None else tokens
    params = parameters(plan)
    names = checkpoint_names([(path, r) for path, r in params if not is_routed_expert(path, r)])
    modules = sorted(attention_modules(params))
    blocks = attention_blocks(plan, params) if blocks is None else blocks
    inputs = {block.module: block.inputs for block in blocks}
    found = []
    for path, record in params:
        block = next((b for b in modules if module_of(path).startswith(b + "/")), None)
        # An attention projection that multiplies the block's input (its first dimension the model width).
        logical = [n for n in record.logical or () if not is_stack_name(n)]
        reads = inputs.get(block) if block is not None and logical[:1] == ["embed"] else None
        found.append(
            dataclasses.replace(
                weight(plan, path, record, tokens, case),
                checkpoint=names.get(path),
                in_attention=block is not None,
                reads=reads[1] if reads is not None else None,
            )
        )
    return tuple(found)


def parameters(plan: Plan) -> list[tuple[str, TensorRecord]]:
    """The plan's parameters but lookup tables, in its order."""
    return [(path, r) for path, r in plan.tensors if r.kind == "param" and not is_lookup_table(r)]


def nbytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of a dense array."""
    import ml_dtypes  # noqa: F401  # lazy: registers bfloat16 and the float8 types with numpy
    import numpy as np

    return math.prod(shape) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class Placement:
    """What every part of a prediction reads from one plan, worked out once."""

    case: Case | None  # the plan's case resolved again (None: it no longer resolves)
    batch_axes: tuple[str, ...]  # `token_axes`
    weights: tuple[Weight, ...]
    tokens: int  # `device_tokens`
    micro_tokens: int  # `microbatch_tokens` (= tokens outside pipelines)
    attention: tuple[Attention, ...] = ()  # `roles.attention_blocks`
    dtype: str | None = None  # `activation_dtype`
    layer_tokens: int = 0  # `layer_tokens` (= tokens without sequence parallelism)


def placement_of(plan: Plan, case: Case | None = None) -> Placement:
    """The plan's placement facts (`case`: the plan's case when the caller has it, else resolved again)."""
    case = case if case is not None else resolved(plan)
    batch = token_axes(plan)
    tokens = device_tokens(plan)
    blocks = attention_blocks(plan, parameters(plan))
    # A sequence-parallel axis splits the tokens outside the layers only: inside, it splits the weights.
    sequence = sequence_parallel_axes(plan, batch)
    inside = tuple(axis for axis in batch if axis not in sequence)
    every = weights(plan, case, inside, blocks)
    micro = microbatch_tokens(case, tokens, mesh_sizes(plan), batch)
    dtype = activation_dtype(plan, case)
    return Placement(case, batch, every, tokens, micro, blocks, dtype, layer_tokens(plan, tokens, sequence))


def collective_row(
    op: str,
    axes: tuple[str, ...],
    shape: tuple[int, ...],
    dtype: str,
    pass_: str,
    source: str,
    cause: Cause,
    count: int = 1,
    trips: int = 1,
    shift: int | None = None,
    handoff: bool = False,
) -> CollectiveRow:
    """A predicted collective moving `shape` in `dtype`, `count` times per loop trip (once per step by default);
    `handoff`: it passes one iteration's result to the next, which waits for it (see `CollectiveRow`)."""
    return CollectiveRow(
        op=op,
        axes=axes,
        dtype=dtype,
        shape=shape,
        bytes=nbytes(shape, dtype),
        count=count,
        loop_trips=trips,
        pass_=pass_,
        source=source,
        cause=cause,
        shift=shift,
        handoff=handoff,
    )


def layer_row(
    op: str,
    weight: Weight,
    axes: tuple[str, ...],
    shape: tuple[int, ...],
    dtype: str,
    pass_: str,
    cause: Cause,
    count: int = 1,
    source: str | None = None,
) -> CollectiveRow:
    """A collective that runs `count` times in each layer of the weight's stack (each loop trip runs
    `per_trip` layers), moving `shape` in `dtype`."""
    module = weight.module if source is None else source
    return collective_row(op, axes, shape, dtype, pass_, module, cause, count * weight.per_trip, weight.loop_trips)
