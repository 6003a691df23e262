"""A tensors-only plan's compute, predicted: the work profile a compile would give, from the model's matmuls.

A compiled plan's work profile (`shardscope.hlo.profile`) bins every op of the step; here the same bins are
written from the placement alone, so the cost model prices a prediction exactly as it prices a compile (per
op, overlapped with the collectives of the same loop body):
- every weight's matmul: 2 FLOPs per multiply-add of the tokens a device holds where the layer uses it with
  the weight as that device holds it then (gathered over FSDP axes, still split over tensor or expert axes);
  HBM bytes: the weight's slice and the tokens in and out;
- an expert's matmul runs on its capacity slots (dropless: every token a peer sends), as the MoE body does;
- attention's scores and values: 2·(q·k + p·v) per query, key pair, on the heads a device holds; under a
  causal flash kernel the blocks on and below the diagonal only, as kernel work (FLOPs, scores kept on
  chip), its backward pass the kernel's (3.5 forwards, 2.5 with the fused kernel);
- the backward pass doubles each matmul (the gradients of the input and of the weight), and full remat runs
  the forward pass once more;
- elementwise work (norms, activations, the residual stream): each recorded activation moved 1.2 times per
  pass (a write and a read, less what the TPU fuses into the matmuls), as memory-bound bytes; a dropless
  MoE's dispatch slots 8 times (`_DISPATCH_PASSES`); the optimizer reads and writes the state once per step;
- a pipeline's loop state (its stage inputs and outputs, circular storage and shift buffer) is read and
  written at every iteration; a circular pipeline with Explicit axes adds, per step, passes over the
  stage's weights (the visit gradient summed in float32 and added into the stored gradient): both counted
  from the program in `predict.pipeline_work`.
A pipelined stack's loop runs once per iteration (microbatches × repeats + stages − 1: the bubble
included), each trip one repeat's layers on one microbatch. Everything here is per device.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from reference_models.config import DecoderConfig
from shardscope.case.resolve import Case
from shardscope.case.rules import entry_axes
from shardscope.hlo.attention_kernels import causal_block_fraction
from shardscope.hlo.profile import WorkBin, WorkKind
from shardscope.plan.document import Plan
from shardscope.plan.records import TensorRecord, is_stack_name
from shardscope.predict.layout import (
    Placement,
    Weight,
    activation_dtype,
    capacity,
    dense_dispatch,
    feature_dims,
    is_output_projection,
    mesh_sizes,
    nbytes,
    placement_of,
    sequence_length,
    stack_of,
)
from shardscope.predict.pipeline_work import loop_state, visit_gradients
from shardscope.predict.roles import Attention, block_input, embed_width, sharing_blocks, unplaced_modules

# HBM passes over a MoE block's slots per forward pass. As written there are four (the tokens read by the
# gather that fills them, the slots written, read by the expert matmuls, the outputs' slots read back by the
# combine's gather); the TPU also relays the permuted rows out to its tiled layouts and back, which its
# compiles show as reshapes and copies as large as the gathers. Fitted (`benchmarks/prediction.py fit`) to
# the compiled steps of the fitting runs' stored plans alone (`fitting_set.yaml`, the cost model's rule):
# 8, about the four × the 2 that the CPU route's gathers are priced at for the same relayouts.
_DISPATCH_PASSES = 8
# HBM passes per pass over each recorded activation (norms, activation functions, the residual stream). A
# write and a read each would be 2; the TPU fuses much of this work into the matmuls beside it (a norm into
# the projection that reads it, an activation function into its matmul's output), so it moves less. Fitted
# with `_DISPATCH_PASSES`, to the same plans: 1.2, the 0.6 of a naive count at which the CPU route prices
# its other elementwise bytes.
_ELEMENTWISE_PASSES = 1.2


@dataclass(frozen=True)
class _Use:
    """One matmul of a layer: its per-device FLOPs and HBM bytes once (forward), and where it runs."""

    flops: float
    bytes: float
    trips: int
    bubble: float
    recomputed: bool = True  # the backward pass runs it again (remat), unless the policy keeps its output
    backward: float = 2.0  # its backward work in forwards (a matmul: the input's and the weight's gradients)
    rerun: bool = False  # the backward pass runs it again whatever the remat (a tiled loss's output head)


def _bubble(case: Case | None, weight: Weight, tokens: int, micro_tokens: int) -> float:
    """How many times a pipelined stack's loop trip runs a layer on `tokens` worth of work (1 outside
    pipelines): each trip runs `per_trip` layers on one microbatch, bubble iterations included."""
    if case is None or case.preset.pipeline is None or not weight.stack_axes:
        return 1.0
    return weight.per_trip * micro_tokens / max(1, tokens)


def moe_input(plan: Plan, weight: Weight) -> TensorRecord | None:
    """The tokens entering an expert weight's MoE block, as the block records them (`roles.block_input`)."""
    width = embed_width(weight.record)
    found = block_input(plan, weight.module, width) if width is not None else None
    return found[1] if found is not None else None


def expert_slots(plan: Plan, weight: Weight, case: Case | None, fallback: int) -> int:
    """Slots each local expert runs on: the capacity of a device's tokens, from every peer that sends them."""
    inputs = moe_input(plan, weight)
    local = math.prod(inputs.shard_shape[:-1]) if inputs is not None else fallback
    split = {axis for entry in (inputs.spec[:-1] if inputs is not None else ()) for axis in entry_axes(entry)}
    sizes = mesh_sizes(plan)
    peers = math.prod(sizes[a] for a in weight.kept_axes if a in split)
    return peers * capacity(local, case, sequence_length(inputs))


def _activation_itemsize(plan: Plan, case: Case | None) -> int:
    """Bytes per element of the activations (`layout.activation_dtype`; float32 where neither the case nor
    the plan's activations say)."""
    dtype = activation_dtype(plan, case)
    return nbytes((1,), dtype) if dtype is not None else 4


def _weight_use(plan: Plan, weight: Weight, case: Case | None, tokens: int, micro: int, saved: frozenset[str]) -> _Use:
    """The weight's matmul in one layer: tokens × its slice as the layer uses it (weight bytes in its own
    dtype, the tokens in and out in the activations')."""
    shape = weight.layer_shape
    itemsize = _activation_itemsize(plan, case)
    if weight.is_expert:
        slots = expert_slots(plan, weight, case, tokens)
        local_experts = shape[0]
        inner = math.prod(shape[1:])
        flops = 2.0 * slots * local_experts * inner
        rows = slots * local_experts
        io = rows * (shape[1] + shape[-1]) * itemsize if len(shape) >= 3 else 0
    else:
        flops = 2.0 * tokens * math.prod(shape)
        inputs, outputs = feature_dims(weight)
        features = math.prod(shape[d] for d in inputs) + math.prod(shape[d] for d in outputs)
        io = tokens * features * itemsize if shape else 0
    weight_bytes = nbytes(shape, weight.record.dtype)
    # An output projection (`layout.is_output_projection`) whose result only joins the residual stream
    # (attention's, a dense MLP's) is not run again: the gradients need its input, not its output, so the
    # compiler drops it from the rematerialised forward pass (an expert's is needed: the combine weights its
    # output).
    feeds_residual = is_output_projection(weight) and not weight.is_expert
    # Remat recomputes the layer stacks only; a tiled loss (MaxText's num_vocab_tiling) recomputes the output
    # head's logits chunk by chunk in its backward pass.
    again = weight.stacked and recomputed(weight, saved) and not feeds_residual
    rerun = not weight.stacked and case is not None and case.model.vocab_tiles > 1
    return _Use(flops, weight_bytes + io, weight.loop_trips, _bubble(case, weight, tokens, micro), again, rerun=rerun)


def recomputed(weight: Weight, saved: frozenset[str]) -> bool:
    """Whether the backward pass runs the weight's matmul again: its output's checkpoint name
    (`Weight.checkpoint`) is not among those the remat policy keeps (`kept_outputs`)."""
    return weight.checkpoint is None or weight.checkpoint not in saved


def _dispatch(plan: Plan, every: tuple[Weight, ...], case: Case | None, tokens: int, micro: int) -> list[_Use]:
    """Each MoE block's token dispatch and combine: its slots [local experts, slots, embed] are zeroed,
    scattered into, read by the first matmuls, and the outputs' slots gathered back (memory-bound). In
    MaxText's dense MoE, two one-hot matmuls instead (`_dense_dispatch`)."""
    itemsize = _activation_itemsize(plan, case)
    uses: list[_Use] = []
    blocks: set[str] = set()
    for weight in every:
        if not weight.is_expert or is_output_projection(weight) or weight.module in blocks:
            continue  # one per block: an expert input projection [experts, model width, hidden]
        blocks.add(weight.module)
        slots = expert_slots(plan, weight, case, tokens)
        embed = weight.layer_shape[1] if len(weight.layer_shape) >= 3 else 1
        slot_bytes = weight.layer_shape[0] * slots * embed * itemsize
        bubble = _bubble(case, weight, tokens, micro)
        if dense_dispatch(case):
            uses.extend(_dense_dispatch(plan, weight, case, tokens, slot_bytes, bubble))
            continue
        uses.append(_Use(0.0, _DISPATCH_PASSES * slot_bytes, weight.loop_trips, bubble))
    return uses


def _dense_dispatch(
    plan: Plan, weight: Weight, case: Case | None, tokens: int, slot_bytes: float, bubble: float
) -> list[_Use]:
    """MaxText's dense MoE: the tokens [batch, seq, embed] carried into the slots of every expert the mask
    spans ([experts, batch, capacity, embed]) by one one-hot matmul and back by another, each 2 × tokens ×
    experts × capacity × embed FLOPs; their masks [batch, seq, experts, capacity] in the activations' dtype.
    The backward pass, recomputed forward included, runs twice their forward FLOPs (the compiled programs':
    the masks need no gradient but the combine's routing weights do)."""
    inputs = moe_input(plan, weight)
    seq = sequence_length(inputs)
    if inputs is None or seq is None or case is None:
        return []
    masked = math.prod(inputs.shard_shape[:-1])  # the tokens the masks span
    per_row = capacity(seq, case, seq)
    local_experts = weight.layer_shape[0]
    experts = case.model.num_experts
    if case.preset.moe == "ring" and local_experts < experts:
        # The ring gathers its group's tokens and masks them for the local experts only.
        masked, experts = expert_slots(plan, weight, case, tokens) // per_row * seq, local_experts
    flops = 2.0 * masked * experts * per_row * inputs.shape[-1]
    mask_bytes = masked * experts * per_row * _activation_itemsize(plan, case)
    use = _Use(flops, slot_bytes + 2 * mask_bytes, weight.loop_trips, bubble, recomputed=False)
    return [use, use]  # the dispatch and the combine


# A flash kernel's backward work in forwards: the query-gradient kernel's three [L × S] matmuls and the
# key/value-gradient kernel's four (or the fused kernel's five), against the forward pass's two.
_KERNEL_BACKWARD = {False: 7 / 2, True: 5 / 2}


def _attention_uses(
    blocks: tuple[Attention, ...], every: tuple[Weight, ...], case: Case | None, tokens: int, kept: bool
) -> list[_Use]:
    """Scores and weighted values of each attention block whose query, key and value the plan records: under
    a flash kernel (`flash_kernel`), its causal block grid's work, with the kernel's backward."""
    kernel = flash_kernel(case)
    uses: list[_Use] = []
    for block in blocks:
        module, query, key, value = block.module, block.query[1], block.key[1], block.value[1]
        if len(query.shard_shape) != 4:
            continue
        batch, length, heads, qk = query.shard_shape
        keys = key.shape[1]  # every key: a query shard attends to the whole sequence
        grid = max(1, keys // max(1, min(kernel.attention_block, keys))) if kernel is not None else 0
        pairs = batch * length * heads * keys * (causal_block_fraction(grid) if kernel is not None else 1.0)
        flops = 2.0 * pairs * (qk + value.shape[-1])
        # Scores are not written to HBM by a kernel; the stand-in (dot_product) writes and reads them.
        score_bytes = 0.0 if kernel is not None else pairs * nbytes((1,), query.dtype) * 2
        io = sum(t.bytes_per_device for t in (query, key, value))
        stack = stack_of(module, every)
        trips = stack.loop_trips if stack is not None else 1
        # Inside a pipeline the recorded query is one microbatch's already: each trip runs it once per layer.
        bubble = _bubble(case, stack, tokens, tokens) if stack is not None else 1.0
        backward = _KERNEL_BACKWARD[kernel.attention_fused_backward] if kernel is not None else 2.0
        uses.append(_Use(flops, io + score_bytes, trips, bubble, not kept, backward))
    return uses


def flash_kernel(case: Case | None) -> DecoderConfig | None:
    """The model, when its attention runs as a flash kernel (None: plain attention, or no case)."""
    return case.model if case is not None and case.model.uses_flash_attention else None


def _elementwise(plan: Plan, every: tuple[Weight, ...], case: Case | None, tokens: int, micro: int) -> list[_Use]:
    """Each recorded activation written and read once (norms, activation functions, the residual stream)."""
    uses: list[_Use] = []
    unplaced = set(unplaced_modules(plan))
    for path, record in plan.tensors:
        if record.kind != "activation" or record.logical is None:
            continue
        module = path.removeprefix("activations/").rsplit("/", 1)[0]
        # Recorded apart from the weights, once for every layer that runs it: once per layer of each block.
        blocks = sharing_blocks(plan, path, record) if module in unplaced else ()
        for block in blocks or (module,):
            stack = stack_of(block, every)
            trips = stack.loop_trips if stack is not None and _in_stack(block, stack) else 1
            bubble = _bubble(case, stack, tokens, micro) if stack is not None and trips > 1 else 1.0
            uses.append(_Use(0.0, _ELEMENTWISE_PASSES * record.bytes_per_device, trips, bubble))
    return uses


def _in_stack(module: str, stack: Weight) -> bool:
    """Whether `module` lies under the stacked layers `stack` belongs to (same first two path parts)."""
    return module.split("/")[:2] == stack.module.split("/")[:2]


def _optimizer_bytes(plan: Plan) -> float:
    """The update reads each parameter, its gradient and its optimizer state, and writes parameter and state."""
    params = sum(t.bytes_per_device for _, t in plan.tensors if t.kind == "param")
    state = sum(t.bytes_per_device for _, t in plan.tensors if t.kind == "opt_state")
    return 3.0 * params + 2.0 * state


def _bins(uses: Iterable[_Use], kind: WorkKind, remat: bool) -> list[WorkBin]:
    """The uses as work bins, per pass and loop, forward work once, backward twice (plus remat's forward)."""
    totals: dict[tuple[str, int], list[float]] = {}
    for use in uses:
        again = 1.0 if (remat and use.recomputed) or use.rerun else 0.0
        passes = (("forward", 1.0), ("backward", use.backward + again))
        for pass_, factor in passes:
            entry = totals.setdefault((pass_, use.trips), [0.0, 0.0, 0.0])
            scale = factor * use.trips * use.bubble
            entry[0] += use.flops * scale
            entry[1] += use.bytes * scale
            entry[2] += factor * use.trips
    return [
        WorkBin(kind, pass_, trips, None, round(ops), round(flops), round(nbytes), trips)
        for (pass_, trips), (flops, nbytes, ops) in sorted(totals.items())
    ]


def kept_outputs(case: Case | None) -> frozenset[str]:
    """The checkpoint names the case's remat policy keeps (on the device or offloaded to the host): their
    matmuls are not run again in the backward pass."""
    if case is None or case.model.remat in ("full", "none"):
        return frozenset()
    # lazy: reference_models.remat imports JAX, which only a prediction needs here
    from reference_models.remat import OFFLOADED, SAVED

    policy = case.model.remat
    if policy == "custom":
        return frozenset(name for name, where in case.model.remat_custom if where in ("device", "offload"))
    return frozenset(SAVED.get(policy, ()) + OFFLOADED.get(policy, ()))


def predicted_work(plan: Plan, remat: bool, placement: Placement | None = None) -> tuple[WorkBin, ...]:
    """The plan's step as work bins (see the module docstring), per device."""
    found = placement or placement_of(plan)
    case, every, tokens, micro = found.case, found.weights, found.tokens, found.micro_tokens
    saved = kept_outputs(case)
    # The experts' matmuls run as the grouped-matmul kernel where the case says so (config.expert_matmul).
    grouped = case is not None and case.model.expert_matmul == "grouped"
    matrices = [w for w in every if not _is_vector(w)]
    experts = [w for w in matrices if grouped and w.is_expert]
    # Matmuls run on the tokens inside the layers (gathered over sequence-parallel axes, `layout.layer_tokens`).
    inside = found.layer_tokens or tokens
    inside_micro = micro * inside // tokens
    matmuls = [_weight_use(plan, w, case, inside, inside_micro, saved) for w in matrices if w not in experts]
    attention = _attention_uses(found.attention, every, case, tokens, "context" in saved)
    # A flash kernel keeps its scores on chip: priced as the kernel (its FLOPs at the kernel's efficiency, as
    # a compiled plan's kernel ops are), a plain attention as the matmuls it is.
    flash = flash_kernel(case) is not None
    matmuls += [] if flash else attention
    kernel = [_weight_use(plan, w, case, tokens, micro, saved) for w in experts]
    dispatch = _dispatch(plan, every, case, tokens, micro)
    matmuls += [use for use in dispatch if use.flops]  # MaxText's dense MoE: one-hot matmuls
    elementwise = _elementwise(plan, every, case, tokens, micro) + [use for use in dispatch if not use.flops]
    bins = (
        _bins(matmuls, WorkKind.MATMUL, remat)
        + _bins(kernel, WorkKind.GROUPED, remat)
        + _bins(elementwise, WorkKind.MEMORY, remat)
    )
    if flash:
        bins += [dataclasses.replace(b, bytes=0, intensity=None) for b in _bins(attention, WorkKind.KERNEL, remat)]
    bins.append(WorkBin(WorkKind.MEMORY, "optimizer", 1, None, 1, 0, round(_optimizer_bytes(plan)), 1))
    bins += visit_gradients(plan, every, case) + loop_state(plan, every, case, micro)
    return tuple(sorted(bins, key=lambda entry: entry.key))


def _is_vector(weight: Weight) -> bool:
    """A scale or bias (one non-stack dimension): elementwise work, not a matmul."""
    logical = weight.record.logical or (None,) * len(weight.record.shape)
    return sum(1 for name in logical if not is_stack_name(name)) < 2
