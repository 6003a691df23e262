"""Mixture of experts as MaxText lays it out (`layers/moe.py`), with expert parallelism written out in shard_map.

Parameters and placements follow MaxText's `RoutedMoE`: a `gate` (`kernel`, and `bias` for DeepSeek-V3's
router), expert weights `wi_0`/`wi_1` [exp, embed_moe, mlp_moe] and `wo` [exp, mlp_moe, embed_moe]; the
block's `inputs` and `gate_logits` are placed on (activation_batch, activation_norm_length, -), and the
expert weights on the spec of (exp, -, mlp_no_fsdp) with FSDP removed (MaxText's `w0_kernel`, ...): they
are gathered over FSDP once, where they enter the expert computation. Under MaxText's `shard_exp_on_fsdp`
the expert weights are stored [exp on embed_moe's axes, -, mlp_moe] and placed whole but for mlp_no_fsdp,
so the gather concatenates whole experts.

Two strategies run the experts, chosen by the preset's `moe` setting:
- `all_to_all`: each device scatters its tokens into per-expert slots, an all-to-all over the
  expert-parallel axes carries each slot to the device holding its expert, the experts run, and a second
  all-to-all brings the results home to be combined with the routing weights.
- `ring` ("ring of experts"): the tokens of the expert group are all-gathered, each device runs only its
  local experts on the tokens routed to them, and the partial outputs are reduce-scattered back. No
  all-to-all; good when there are few tokens.
The expert-parallel axes are the mesh axes of the placed weights' expert dimension; mesh axes on their
hidden dimension (tensor parallelism) leave partial sums that are added over those axes. With capacity =
local tokens the block is dropless and equals a single-device MoE exactly.

How tokens enter their slots follows MaxText's matmul choice. With a capacity factor and no grouped kernel
(MaxText's dense MoE, `sparse_matmul=false`), as MaxText's `generate_masks` and dispatch/combine einsums
do: each sequence has its own capacity per expert, its choices beyond it dropped, and one-hot masks carry
tokens into slots and back on the matrix units. Otherwise (dropless, or the grouped kernel's capacity
factor 1) as MaxText's sparse path sorts them: the device's tokens, repeated once per choice, are gathered
into their slots and gathered back, each gather's backward pass the gather the other way.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from reference_models.config import GROUPED_SCOPE, DecoderConfig
from reference_models.layers import MlpBlock, logical_param
from reference_models.router import GateLogit, route
from reference_models.sharding import ambient_mesh, constrain, constrain_physical, current_context, entry_axes, place

_TOKENS = ("activation_batch", "activation_norm_length", None)
_WI = ("exp", "embed_moe", "mlp_moe")
_WO = ("exp", "mlp_moe", "embed_moe")
# Under MaxText's `shard_exp_on_fsdp` ("special sharding for dsv3"): the expert dimension on the FSDP axes
# (`embed_moe`'s) and the model dimension whole.
_WI_ON_FSDP = ("embed_moe", None, "mlp_moe")
_WO_ON_FSDP = ("embed_moe", "mlp_moe", None)
# Where MaxText's sparse (megablox) path places the expert weights, before removing FSDP from the spec; under
# `shard_exp_on_fsdp` with no expert dimension (MaxText allows it without expert parallelism only).
_WI_PLACED = ("exp", None, "mlp_no_fsdp")
_WI_PLACED_ON_FSDP = (None, None, "mlp_no_fsdp")
# Under MaxText's `use_2d_fsdp_sharding`, all three: experts on embed_moe's axes and the first matrix dimension
# on mlp_moe's (whose rule comes first and takes fsdp_transpose, leaving embed_moe fsdp); placed whole.
_W_2D = ("embed_moe", "mlp_moe", None)
_W_PLACED_2D = (None, "mlp_no_fsdp", None)  # mlp_no_fsdp's axes are of size 1 here (case.resolve checks it)
# The mesh axis MaxText's MoE gathers the expert weights over before the expert computation.
_GATHERED_AXIS = "fsdp"

Axes = tuple[str, ...]


def _capacity(tokens: int, k: int, experts: int, factor: float | None) -> int:
    if factor is None:
        return tokens  # a token picks an expert at most once
    return max(1, min(tokens, math.ceil(tokens * k / experts * factor)))


def row_capacity(seq: int, k: int, experts: int, factor: float) -> int:
    """Slots per expert for one sequence, as MaxText's dense MoE computes them (`generate_masks`)."""
    return int(max(math.ceil(seq * k / experts) * factor, factor))


@dataclass(frozen=True)
class ExpertLayout:
    """How experts and tokens are laid out for the per-device MoE body.

    The experts are split into blocks over `ep_axes` (in the order the weights' spec lists them, major
    first). Tokens move between devices only over `exchange_axes`, the expert-parallel axes that also split
    the tokens; over the others (`sum_axes`) every device already holds the same tokens, so each runs its
    own experts on them and the partial outputs are added.
    """

    num_experts: int
    capacity_factor: float | None
    ep_axes: Axes = ()
    ep_sizes: tuple[int, ...] = ()
    exchange_axes: Axes = ()
    tp_axes: Axes = ()  # mesh axes splitting the experts' hidden dimension (their partial sums are added)
    grouped: bool = False  # the experts' matmuls run as a grouped-matmul kernel (config.expert_matmul)

    @property
    def ep_size(self) -> int:
        return math.prod(self.ep_sizes)

    @property
    def sum_axes(self) -> Axes:
        return tuple(a for a in self.ep_axes if a not in self.exchange_axes)

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.ep_size


def _axis(axes: Axes) -> str | Axes:
    """A collective's axis_name: one name, or a tuple of several."""
    return axes[0] if len(axes) == 1 else axes


def _exchange_blocks(layout: ExpertLayout) -> jax.Array:
    """The expert blocks this device exchanges tokens with: one per position along the exchange axes (in
    all-to-all order), each combined with this device's own position along the other expert axes."""
    exchange = [(a, n) for a, n in zip(layout.ep_axes, layout.ep_sizes, strict=True) if a in layout.exchange_axes]
    count = math.prod(n for _, n in exchange)
    blocks = jnp.zeros((count,), jnp.int32)
    position = jnp.arange(count, dtype=jnp.int32)
    stride = count
    exchange_strides = {}
    for axis, size in exchange:  # the exchange position's digits, major first
        stride //= size
        exchange_strides[axis] = stride
    for axis, size in zip(layout.ep_axes, layout.ep_sizes, strict=True):
        if axis in exchange_strides:
            digit = (position // exchange_strides[axis]) % size
        else:
            digit = jnp.full((count,), jax.lax.axis_index(axis), jnp.int32)
        blocks = blocks * size + digit
    return blocks


def _experts(tokens: jax.Array, wi_0: jax.Array, wi_1: jax.Array, wo: jax.Array, layout: ExpertLayout) -> jax.Array:
    """SwiGLU experts on per-expert slots [..., experts, slots, embed] (leading dims: the peers the slots
    came from, kept apart so no transpose gathers them)."""
    dtype = tokens.dtype

    def grouped(equation: str, x: jax.Array, w: jax.Array) -> jax.Array:
        # Under `GROUPED_SCOPE` when the experts run as the grouped-matmul kernel (the cost model's cue).
        with jax.named_scope(GROUPED_SCOPE) if layout.grouped else contextlib.nullcontext():
            return jnp.einsum(equation, x, w.astype(dtype))

    # Named as MaxText names them, for the remat policies (reference_models/remat.py).
    gate = checkpoint_name(checkpoint_name(grouped("...xce,xem->...xcm", tokens, wi_0), "mlpwi_0"), "moe_mlpwi_0")
    up = checkpoint_name(checkpoint_name(grouped("...xce,xem->...xcm", tokens, wi_1), "mlpwi_1"), "moe_mlpwi_1")
    out = grouped("...xcm,xme->...xce", nn.silu(gate) * up, wo)
    out = checkpoint_name(checkpoint_name(out, "mlpwo"), "moe_mlpwo")
    return jax.lax.psum(out, _axis(layout.tp_axes)) if layout.tp_axes else out


@jax.custom_vjp
def _permute_rows(rows: jax.Array, index: jax.Array, inverse: jax.Array) -> jax.Array:
    """`rows[index]`, an index past the end reading zeros, where `index` and `inverse` are the two directions
    of one partial permutation of rows. Its backward pass is the gather the other way (MaxText's
    `_sort_activations` with `use_custom_sort_vjp`), not the scatter-add JAX would otherwise transpose the
    gather into: each row goes to at most one place, so nothing is added."""
    return rows.at[_unsigned(index)].get(mode="fill", fill_value=0)


def _permute_rows_forward(rows, index, inverse):
    return _permute_rows(rows, index, inverse), inverse


def _permute_rows_backward(inverse, grad):
    return grad.at[_unsigned(inverse)].get(mode="fill", fill_value=0), None, None


def _unsigned(index: jax.Array) -> jax.Array:
    """Inside a pipeline's vmap over stages, an index the gather takes as it is: a signed one is first
    wrapped where negative, a computation whose constant does not vary over the mesh axis the vmap adds to
    the shard_map (which then fails its varying-axis check). Elsewhere the index as it is."""
    context = current_context()
    return index.astype(jnp.uint32) if context is not None and context.pipeline is not None else index


_permute_rows.defvjp(_permute_rows_forward, _permute_rows_backward)


def _vary_like(rows: jax.Array, index: jax.Array) -> jax.Array:
    """`rows` marked as varying over the manual mesh axes `index` varies over and it does not (inside a
    shard_map: an expert block's slot map differs per device while the tokens may not), so that its
    permutation's backward pass, which varies as the index does, matches it (and JAX sums over those axes)."""

    def varying(value: jax.Array) -> frozenset[str]:
        axis_type = getattr(jax.typeof(value), "manual_axis_type", None)
        return frozenset(axis_type.varying) if axis_type is not None else frozenset()

    extra = varying(index) - varying(rows)
    return jax.lax.pcast(rows, tuple(sorted(extra)), to="varying") if extra else rows


@dataclass(frozen=True)
class SlotMap:
    """Where each (token, choice) pair sits among the slots, both ways: `dest` [pairs] (a dropped choice, or
    one for another expert, points one past the last slot) and `source` [slots] (an empty slot points one
    past the last pair)."""

    dest: jax.Array
    source: jax.Array


def _to_slots(tokens, ids, first_expert, num_experts, capacity):
    """Each (token, choice) for experts [first, first + num) into per-expert slots, as MaxText's sparse
    path sorts them (`permute`: the tokens repeated once per choice, then gathered into place).

    Returns the slots [num_experts, capacity, embed] and the slot map; choices for other experts or beyond
    capacity (dropped) have no slot.
    """
    count, embed = tokens.shape
    k = ids.shape[-1]
    local = ids.reshape(count * k) - first_expert
    mine = (local >= 0) & (local < num_experts)
    one_hot = jax.nn.one_hot(jnp.where(mine, local, num_experts), num_experts, dtype=jnp.int32)
    slot = jnp.sum((jnp.cumsum(one_hot, axis=0) - 1) * one_hot, axis=-1)
    slots_total = num_experts * capacity
    dest = jnp.where(mine & (slot < capacity), local * capacity + slot, slots_total)
    source = jnp.full((slots_total,), count * k, jnp.int32).at[dest].set(jnp.arange(count * k), mode="drop")
    pairs = _vary_like(jnp.repeat(tokens, k, axis=0), source)
    slots = _permute_rows(pairs, source, dest)
    return slots.reshape(num_experts, capacity, embed), SlotMap(dest, source)


def _from_slots(out, where: SlotMap, weights):
    """Weighted sum over each token's choices of its slots' outputs (a choice without a slot reads zeros),
    as MaxText's `unpermute` gathers them back and sums them."""
    num_experts, capacity, embed = out.shape
    count, k = weights.shape
    flat = _vary_like(out.reshape(num_experts * capacity, embed), where.dest)
    choices = _permute_rows(flat, where.dest, where.source)
    return jnp.einsum("tke,tk->te", choices.reshape(count, k, embed), weights.astype(out.dtype))


def _dispatch_masks(weights, ids, first_expert, num_experts, capacity):
    """MaxText's dense MoE (`generate_masks`): for experts [first, first + num), each sequence's choices are
    counted per expert in order, those beyond `capacity` dropped; returns the combine mask [batch, seq,
    experts, capacity] (the routing weight at the choice's slot) and the dispatch mask (where it is non-zero).
    """
    batch, seq, k = ids.shape
    # Choices of other experts one-hot to zeros (an index outside [0, num) has no class).
    expert_mask = jax.nn.one_hot(ids - first_expert, num_experts, dtype=jnp.int32)  # [b, s, k, experts]
    fused = expert_mask.reshape(batch, seq * k, num_experts)
    count = jnp.cumsum(fused, axis=1)  # each choice's 1-based position among its expert's, per sequence
    kept = jnp.sum(expert_mask * (count.reshape(expert_mask.shape) <= capacity), axis=2)  # [b, s, experts]
    routing = jnp.sum(expert_mask * weights[..., None], axis=2) * kept
    position = jnp.sum((fused * count).reshape(expert_mask.shape), axis=2) * kept
    in_capacity = jax.nn.one_hot(position, capacity + 1, dtype=jnp.int32)[..., 1:]  # position 0: not routed
    combine = routing[..., None] * in_capacity
    return combine, (combine != 0)


def _dense_dispatch(x, weights, ids, first_expert, num_experts, layout: ExpertLayout):
    """MaxText's dense dispatch (`sparse_matmul=false` with a capacity factor): one-hot einsums on the
    matrix units; returns the slots [experts, batch × capacity, embed] and the combine mask."""
    batch, seq, embed = x.shape
    factor = layout.capacity_factor
    assert factor is not None  # `_dense(layout)`
    capacity = row_capacity(seq, ids.shape[-1], layout.num_experts, factor)
    combine, dispatch = _dispatch_masks(weights, ids, first_expert, num_experts, capacity)
    with jax.named_scope("dispatch"):
        slots = jnp.einsum("bsm,bsec->ebcm", x, dispatch.astype(x.dtype))
    return slots.reshape(num_experts, batch * capacity, embed), combine


def _dense_combine(out, combine):
    """The experts' outputs [experts, batch × capacity, embed] weighted back into [batch, seq, embed]."""
    batch, _, experts, capacity = combine.shape
    out = out.reshape(experts, batch, capacity, out.shape[-1])
    with jax.named_scope("combine"):
        return jnp.einsum("ebcm,bsec->bsm", out, combine.astype(out.dtype))


def _dense(layout: ExpertLayout) -> bool:
    """Whether the block dispatches as MaxText's dense MoE does: a capacity factor, no grouped kernel."""
    return layout.capacity_factor is not None and not layout.grouped


def all_to_all_body(x, weights, ids, wi_0, wi_1, wo, *, layout: ExpertLayout):
    """Per device: tokens to expert slots, all-to-all to the experts' devices, experts, all-to-all back."""
    batch, seq, embed = x.shape
    k = ids.shape[-1]
    if _dense(layout):
        slots, combine = _dense_dispatch(x, weights, ids, 0, layout.num_experts, layout)
        capacity = slots.shape[1]

        def combined_from(out):
            return _dense_combine(out, combine)
    else:
        capacity = _capacity(batch * seq, k, layout.num_experts, layout.capacity_factor)
        slots, slot_map = _to_slots(x.reshape(batch * seq, embed), ids, 0, layout.num_experts, capacity)

        def combined_from(out):
            return _from_slots(out, slot_map, weights.reshape(batch * seq, k)).reshape(batch, seq, embed)

    if layout.ep_size == 1:
        return combined_from(_experts(slots, wi_0, wi_1, wo, layout))
    local = layout.local_experts
    blocks = slots.reshape(layout.ep_size, local, capacity, embed)
    # With every expert axis an exchange axis, the peers' order is the blocks' own; otherwise this device
    # picks the blocks of its own position along the other expert axes.
    picked = _exchange_blocks(layout) if layout.sum_axes else None
    outgoing = blocks if picked is None else blocks[picked]  # [peers, local, capacity, embed]
    if layout.exchange_axes:
        outgoing = jax.lax.all_to_all(outgoing, _axis(layout.exchange_axes), 0, 0, tiled=True)
    back = _experts(outgoing, wi_0, wi_1, wo, layout)  # the experts' outputs, as the slots came
    if layout.exchange_axes:
        back = jax.lax.all_to_all(back, _axis(layout.exchange_axes), 0, 0, tiled=True)
    full = back if picked is None else jnp.zeros(blocks.shape, back.dtype).at[picked].set(back)
    combined = combined_from(full.reshape(layout.num_experts, capacity, embed))
    if layout.sum_axes:
        combined = jax.lax.psum(combined, _axis(layout.sum_axes))
    return combined


def ring_body(x, weights, ids, wi_0, wi_1, wo, *, layout: ExpertLayout):
    """Per device ("ring of experts"): all-gather the expert group's tokens, run only the local experts
    on the tokens routed to them, and reduce-scatter the partial outputs back. No all-to-all."""
    exchange = _axis(layout.exchange_axes) if layout.exchange_axes else None
    if exchange is not None:
        x, weights, ids = (jax.lax.all_gather(a, exchange, axis=0, tiled=True) for a in (x, weights, ids))
    batch, seq, embed = x.shape
    k = ids.shape[-1]
    first = jax.lax.axis_index(_axis(layout.ep_axes)) * layout.local_experts
    if _dense(layout):
        slots, combine = _dense_dispatch(x, weights, ids, first, layout.local_experts, layout)
        partial_out = _dense_combine(_experts(slots, wi_0, wi_1, wo, layout), combine)
    else:
        capacity = _capacity(batch * seq, k, layout.num_experts, layout.capacity_factor)
        slots, slot_map = _to_slots(x.reshape(batch * seq, embed), ids, first, layout.local_experts, capacity)
        partial_out = _from_slots(_experts(slots, wi_0, wi_1, wo, layout), slot_map, weights.reshape(batch * seq, k))
        partial_out = partial_out.reshape(batch, seq, embed)
    if layout.sum_axes:
        partial_out = jax.lax.psum(partial_out, _axis(layout.sum_axes))
    if exchange is None:
        return partial_out
    return jax.lax.psum_scatter(partial_out, exchange, scatter_dimension=0, tiled=True)


def _without(spec: PartitionSpec, dropped: set[str]) -> PartitionSpec:
    entries = [tuple(a for a in entry_axes(e) if a not in dropped) for e in spec]
    return PartitionSpec(*(e if len(e) > 1 else (e[0] if e else None) for e in entries))


class RoutedMoE(nn.Module):
    """Routed experts (top-k): MaxText's `RoutedMoE` (`MoeBlock_0`).

    `gate_logical` is the gate kernel's logical axes: ("embed_moe", None) in DeepSeek, ("embed", None) in
    Mixtral, as MaxText's models pass them.
    """

    config: DecoderConfig
    gate_logical: tuple[str | None, ...]
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        experts, embed = cfg.num_experts, x.shape[-1]
        gate_logits, pre_bias_logits = GateLogit(cfg, self.gate_logical, name="gate")(x)
        wi_axes, wo_axes, placed = (
            (_WI_ON_FSDP, _WO_ON_FSDP, _WI_PLACED_ON_FSDP)
            if cfg.shard_experts_on_fsdp
            else (_W_2D, _W_2D, _W_PLACED_2D)
            if cfg.experts_2d_fsdp
            else (_WI, _WO, _WI_PLACED)
        )
        wi_0 = logical_param(self, "wi_0", (experts, embed, self.hidden), wi_axes)
        wi_1 = logical_param(self, "wi_1", (experts, embed, self.hidden), wi_axes)
        wo = logical_param(self, "wo", (experts, self.hidden, embed), wo_axes)
        inputs = constrain(self.path, "inputs", x, _TOKENS)
        gate_logits = constrain(self.path, "gate_logits", gate_logits, _TOKENS)
        if pre_bias_logits is not None:
            pre_bias_logits = constrain(self.path, "pre_bias_logits", pre_bias_logits, _TOKENS)
        weights, ids = route(gate_logits, pre_bias_logits, cfg.num_experts_per_token, cfg.router)
        context = current_context()
        if context is None:
            layout = ExpertLayout(experts, cfg.capacity_factor, grouped=cfg.expert_matmul == "grouped")
            return all_to_all_body(inputs, weights, ids, wi_0, wi_1, wo, layout=layout)

        token_spec = context.resolve(_TOKENS)
        token_axes = {a for entry in token_spec for a in entry_axes(entry)}
        # Weights gathered over FSDP; a hidden-dimension axis that also splits the tokens is gathered too
        # (adding partial sums over it would mix different tokens).
        wi_spec = _without(context.resolve(placed), {_GATHERED_AXIS})
        ep_axes = entry_axes(wi_spec[0])
        tp_axes = tuple(a for a in entry_axes(wi_spec[2]) if a not in token_axes)
        wi_spec = PartitionSpec(wi_spec[0], None, _axis(tp_axes) if tp_axes else None)
        wo_spec = PartitionSpec(wi_spec[0], _axis(tp_axes) if tp_axes else None, None)
        w0 = constrain_physical(self.path, "w0_kernel", wi_0.astype(cfg.dtype), wi_spec)
        w1 = constrain_physical(self.path, "w1_kernel", wi_1.astype(cfg.dtype), wi_spec)
        wo_kernel = constrain_physical(self.path, "wo_kernel", wo.astype(cfg.dtype), wo_spec)

        layout = ExpertLayout(
            num_experts=experts,
            capacity_factor=cfg.capacity_factor,
            ep_axes=ep_axes,
            ep_sizes=tuple(context.mesh.shape[a] for a in ep_axes),
            exchange_axes=tuple(a for a in ep_axes if a in token_axes),
            tp_axes=tp_axes,
            grouped=cfg.expert_matmul == "grouped",
        )
        body = ring_body if context.moe_strategy == "ring" and layout.ep_size > 1 else all_to_all_body
        route_spec = PartitionSpec(*tuple(token_spec)[:2], None)
        specs = (token_spec, route_spec, route_spec, wi_spec, wi_spec, wo_spec)
        args: tuple[jax.Array, ...] = (inputs, weights, ids, w0, w1, wo_kernel)
        if context.explicit:
            # A shard_map takes arrays of Explicit axes as they are typed: move them onto its in_specs first.
            args = tuple(place(context, arg, spec) for arg, spec in zip(args, specs, strict=True))
        run = jax.shard_map(
            partial(body, layout=layout), mesh=ambient_mesh(context), in_specs=specs, out_specs=token_spec
        )
        return run(*args)


class RoutedAndSharedMoE(nn.Module):
    """DeepSeek's MoE block (`DeepSeekMoeBlock_0`): routed experts (`MoeBlock_0`) plus shared experts."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        routed = RoutedMoE(cfg, ("embed_moe", None), cfg.moe_mlp_dim, name="MoeBlock_0")(x)
        shared = MlpBlock(cfg, cfg.moe_mlp_dim * cfg.num_shared_experts, name="shared_experts")(x)
        return routed + shared
