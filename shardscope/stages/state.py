"""A case's train state and batch before any compile: shapes (`jax.eval_shape`, nothing allocated), logical
axes, and shardings resolved from the preset's rules, with every dimension checked against its mesh axes."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from reference_models.config import DecoderConfig
from reference_models.decoder import Transformer
from shardscope.case.resolve import Case
from shardscope.case.rules import (
    Indivisible,
    Spec,
    drop_unit_axes,
    entry_axes,
    indivisible_dims,
    resolve_logical,
    shard_shape,
)
from shardscope.errors import ShardingError
from shardscope.stages.train_step import make_optimizer

# A pytree path joined with "/" (e.g. "params/decoder/layers/moe/wi_0").
TensorPath = str
Rules = tuple[tuple[str, tuple[str, ...]], ...]
# A logical-axes tuple, one name (or None) per dimension.
LogicalAxes = tuple[str | None, ...]


@dataclass(frozen=True)
class AbstractState:
    """Shapes, logical axes and shardings of the train state and batch, before any compile."""

    state: Any  # {"params": ..., "opt_state": ...} of ShapeDtypeStruct
    batch: Any  # {"tokens": ..., "targets": ...}
    state_shardings: Any
    batch_shardings: Any
    logical: dict[TensorPath, tuple[str | None, ...]]  # param / opt_state leaves that have logical axes
    # ZeRO-1: the parameters' shardings by the rules alone, which the step gathers them to before the forward
    # pass (their stored shardings, in `state_shardings`, are the optimizer state's); None without ZeRO-1.
    param_compute_shardings: Any = None

    @property
    def zero1(self) -> tuple[Any, Any] | None:
        """ZeRO-1's (rules' shardings, stored shardings) of the parameters, or None (`make_train_step`)."""
        if self.param_compute_shardings is None:
            return None
        return self.param_compute_shardings, self.state_shardings["params"]


def path_of(key_path: Sequence[Any]) -> TensorPath:
    """A plain "/"-joined path of dict keys, attribute names and indices."""
    return jax.tree_util.keystr(tuple(key_path), simple=True, separator="/")


def check_divisible(
    path: str, shape: Sequence[int], spec: Spec, case: Case, found: list[Indivisible] | None = None
) -> Spec:
    """`spec` if its mesh axes divide `shape`; else raises, or (lenient, `found` given) records the tensor
    and returns the spec with those dimensions replicated."""
    bad = indivisible_dims(shape, spec, case.mesh_sizes)
    if not bad:
        return spec
    if found is not None:
        found.append(Indivisible(path, tuple(int(d) for d in shape), spec, tuple(bad)))
        dims = {dim for dim, *_ in bad}
        return tuple(None if index in dims else entry for index, entry in enumerate(spec))
    dim, size, axes, ways = bad[0]
    raise ShardingError(
        f"{path}: dimension {dim} has size {size}, which mesh axes {'×'.join(axes)} (= {ways} shards) do not "
        f"divide; change the mesh (--mesh) or the rule for this dimension (try `shardscope explain`)"
    )


def physical_spec(case: Case, logical: Sequence[str | None], rules: Rules | None = None) -> Spec:
    """The spec a logical-axes tuple gets on this case's mesh: the rules' answer (the preset's unless `rules`
    are given) without size-1 axes."""
    return drop_unit_axes(
        resolve_logical(logical, case.preset.logical_axis_rules if rules is None else rules), case.mesh_sizes
    )


def resolver(case: Case, resolved: set[LogicalAxes], rules: Rules | None = None):
    """The models' logical → PartitionSpec resolver for this case (under `rules` instead of the preset's when
    given); it records every tuple it is asked."""

    def resolve(logical: Sequence[str | None]) -> PartitionSpec:
        resolved.add(tuple(logical))
        return PartitionSpec(*physical_spec(case, logical, rules))

    return resolve


def input_spec(case: Case) -> PartitionSpec:
    """Input batch sharding as MaxText's `get_input_data_sharding`: the preset's
    `input_data_sharding_logical_axes` (batch, sequence) resolved by its rules."""
    return PartitionSpec(*physical_spec(case, case.preset.input_data_sharding_logical_axes))


def zero1_spec(
    shape: Sequence[int], spec: Spec, axis: str, sizes: dict[str, int], tensor_dims: frozenset[int] = frozenset()
) -> Spec:
    """A stored tensor's spec under ZeRO-1 over `axis`, as MaxText's `add_data_to_sharding` makes it: the
    axis goes first on the first dimension whose shard it divides and that is not split over `tensor`; a
    tensor already split over the axis, or with no such dimension, keeps its spec. MaxText looks at the
    rules' spec before axes of size 1 are dropped: `tensor_dims` are the dimensions its rules put on
    `tensor`, whatever its size."""
    spec = tuple(spec) + (None,) * (len(shape) - len(spec))
    if any(axis in entry_axes(entry) for entry in spec):
        return spec
    for index, (size, entry) in enumerate(zip(shard_shape(shape, spec, sizes), spec, strict=True)):
        axes = entry_axes(entry)
        if "tensor" not in axes and index not in tensor_dims and size % sizes[axis] == 0:
            return (*spec[:index], (axis, *axes), *spec[index + 1 :])
    return spec


@functools.lru_cache(maxsize=16)
def _abstract_train_state(model_config: DecoderConfig, batch_shape: tuple[int, int]) -> tuple[Any, Any]:
    """(abstract state, logical specs) of a model: shapes only, so one trace serves every preset and mesh."""
    tokens = jax.ShapeDtypeStruct(batch_shape, jnp.int32)
    boxed_params = jax.eval_shape(Transformer(model_config).init, jax.random.key(0), tokens)["params"]
    # The optimizer state of boxed params keeps the boxes, so mu/nu inherit the params' logical axes.
    boxed_state = {
        "params": boxed_params,
        "opt_state": jax.eval_shape(make_optimizer(model_config.mu_dtype).init, boxed_params),
    }
    return nn.unbox(boxed_state), nn.get_partition_spec(boxed_state)


def unplaced_state(case: Case) -> tuple[Any, Any]:
    """(state, batch) of ShapeDtypeStruct with no shardings: the step on one device, unsharded."""
    batch_shape = (case.global_batch, case.model.seq_len)
    state, _ = _abstract_train_state(case.model, batch_shape)
    tokens = jax.ShapeDtypeStruct(batch_shape, jnp.int32)
    return state, {"tokens": tokens, "targets": tokens}


def abstract_state(case: Case, mesh: jax.sharding.Mesh, found: list[Indivisible] | None = None) -> AbstractState:
    """Abstract params + AdamW state + batch, with shardings resolved from the preset's rules.

    With `found`, a tensor its mesh axes do not divide is recorded there and placed with those dimensions
    replicated, instead of raising ShardingError.
    """
    batch_shape = (case.global_batch, case.model.seq_len)
    state, logical_specs = _abstract_train_state(case.model, batch_shape)
    logical: dict[TensorPath, tuple[str | None, ...]] = {}
    over = case.preset.shard_optimizer_over
    zero1 = over is not None and case.mesh_sizes.get(over, 1) > 1
    by_rules: dict[TensorPath, NamedSharding] = {}  # ZeRO-1: each tensor as the rules alone place it

    def sharding_for(key_path, leaf, logical_spec) -> NamedSharding:
        path = path_of(key_path)
        names = tuple(logical_spec) if logical_spec is not None else ()
        if names:
            logical[path] = names
        spec = physical_spec(case, names) if names else ()
        spec = spec + (None,) * (len(leaf.shape) - len(spec))
        spec = check_divisible(path, leaf.shape, spec, case, found)
        if zero1 and over is not None:
            by_rules[path] = NamedSharding(mesh, PartitionSpec(*spec))
            rules = resolve_logical(names, case.preset.logical_axis_rules) if names else ()
            tensor_dims = frozenset(i for i, entry in enumerate(rules) if "tensor" in entry_axes(entry))
            spec = zero1_spec(leaf.shape, spec, over, case.mesh_sizes, tensor_dims)
        return NamedSharding(mesh, PartitionSpec(*spec))

    state_shardings = jax.tree_util.tree_map_with_path(
        sharding_for, state, logical_specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )
    # ZeRO-1: the parameters as the rules place them, which the step gathers them to.
    compute_shardings = (
        jax.tree_util.tree_map_with_path(lambda key_path, _: by_rules[path_of(("params", *key_path))], state["params"])
        if zero1
        else None
    )
    batch_spec = PartitionSpec(*check_divisible("inputs/tokens", batch_shape, tuple(input_spec(case)), case, found))
    batch_shardings = {name: NamedSharding(mesh, batch_spec) for name in ("tokens", "targets")}
    # The shardings ride on the abstract values too: with Explicit axes they are the arrays' types.
    placed = jax.tree.map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s), state, state_shardings
    )
    batch = {name: jax.ShapeDtypeStruct(batch_shape, jnp.int32, sharding=s) for name, s in batch_shardings.items()}
    return AbstractState(placed, batch, state_shardings, batch_shardings, logical, compute_shardings)
