"""Model + preset + mesh → abstract state → jitted train step → Lowered → Compiled.

The only module that calls jit/lower/compile. State is abstract (`jax.eval_shape`), so real model
shapes are planned without allocating a byte of parameters. Every tensor's sharding is known once the
step is lowered (`lower_case`); the compile adds the collectives and memory (`compile_case`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from reference_models.config import DecoderConfig
from reference_models.decoder import Transformer, next_token_loss
from reference_models.sharding import ActivationRecord, PipelineSettings, ShardingContext, sharding_context
from shardscope.case import Case, compiler_options_for
from shardscope.errors import CompileError, ShardingError
from shardscope.rules import Spec, drop_unit_axes, indivisible_dims, resolve_logical
from shardscope.topology import build_mesh

# A pytree path joined with "/" (e.g. "params/decoder/layers/moe/wi_0").
TensorPath = str


@dataclass(frozen=True)
class AbstractState:
    """Shapes, logical axes and shardings of the train state and batch, before any compile."""

    state: Any  # {"params": ..., "opt_state": ...} of ShapeDtypeStruct
    batch: Any  # {"tokens": ..., "targets": ...}
    state_shardings: Any
    batch_shardings: Any
    logical: dict[TensorPath, tuple[str | None, ...]]  # param / opt_state leaves that have logical axes


@dataclass(frozen=True)
class LoweredStep:
    """The lowered (not compiled) train step and what was recorded while tracing it."""

    case: Case
    mesh: jax.sharding.Mesh
    abstract: AbstractState
    lowered: Any
    activations: tuple[ActivationRecord, ...]


@dataclass(frozen=True)
class TracedStep:
    """The forward pass traced (not lowered) on the case's mesh: every activation placement, and the
    train step's declared outputs."""

    case: Case
    mesh: jax.sharding.Mesh
    abstract: AbstractState
    activations: tuple[ActivationRecord, ...]
    out_info: Any  # (state, {"loss": …}) of ShapeDtypeStruct with the step's out_shardings


@dataclass(frozen=True)
class CompiledStep:
    """The compiled train step and what was recorded while tracing it."""

    case: Case
    mesh: jax.sharding.Mesh
    abstract: AbstractState
    lowered: Any
    compiled: Any
    activations: tuple[ActivationRecord, ...]
    compiler_options: dict[str, Any]


def path_of(key_path: Sequence[Any]) -> TensorPath:
    """A plain "/"-joined path of dict keys, attribute names and indices."""
    return jax.tree_util.keystr(tuple(key_path), simple=True, separator="/")


def make_optimizer() -> optax.GradientTransformation:
    """AdamW with a learning-rate schedule, as MaxText builds it: its state is (Adam's count, mu, nu),
    weight decay's (empty), the schedule's count — the same tree MaxText's optimizer state has."""
    return optax.adamw(learning_rate=optax.constant_schedule(1e-3), b1=0.9, b2=0.95, weight_decay=0.1)


def _check_divisible(path: str, shape: Sequence[int], spec: Spec, case: Case) -> None:
    bad = indivisible_dims(shape, spec, case.mesh_sizes)
    if bad:
        dim, size, axes, ways = bad[0]
        raise ShardingError(
            f"{path}: dimension {dim} has size {size}, which mesh axes {'×'.join(axes)} (= {ways} shards) do not "
            f"divide; change the mesh (--mesh) or the rule for this dimension (try `shardscope explain`)"
        )


def physical_spec(case: Case, logical: Sequence[str | None]) -> Spec:
    """The spec a logical-axes tuple gets on this case's mesh: the rules' answer without size-1 axes."""
    return drop_unit_axes(resolve_logical(logical, case.preset.logical_axis_rules), case.mesh_sizes)


def _resolver(case: Case):
    def resolve(logical: Sequence[str | None]) -> PartitionSpec:
        return PartitionSpec(*physical_spec(case, logical))

    return resolve


def input_spec(case: Case) -> PartitionSpec:
    """Input batch sharding as MaxText's `get_input_data_sharding`: the preset's
    `input_data_sharding_logical_axes` (batch, sequence) resolved by its rules."""
    return PartitionSpec(*physical_spec(case, case.preset.input_data_sharding_logical_axes))


@functools.lru_cache(maxsize=16)
def _abstract_train_state(model_config: DecoderConfig, batch_shape: tuple[int, int]) -> tuple[Any, Any]:
    """(abstract state, logical specs) of a model: shapes only, so one trace serves every preset and mesh."""
    tokens = jax.ShapeDtypeStruct(batch_shape, jnp.int32)
    boxed_params = jax.eval_shape(Transformer(model_config).init, jax.random.key(0), tokens)["params"]
    # The optimizer state of boxed params keeps the boxes, so mu/nu inherit the params' logical axes.
    boxed_state = {"params": boxed_params, "opt_state": jax.eval_shape(make_optimizer().init, boxed_params)}
    return nn.unbox(boxed_state), nn.get_partition_spec(boxed_state)


def abstract_state(case: Case, mesh: jax.sharding.Mesh) -> AbstractState:
    """Abstract params + AdamW state + batch, with shardings resolved from the preset's rules."""
    batch_shape = (case.global_batch, case.model.seq_len)
    state, logical_specs = _abstract_train_state(case.model, batch_shape)
    logical: dict[TensorPath, tuple[str | None, ...]] = {}

    def sharding_for(key_path, leaf, logical_spec) -> NamedSharding:
        path = path_of(key_path)
        names = tuple(logical_spec) if logical_spec is not None else ()
        if names:
            logical[path] = names
        spec = physical_spec(case, names) if names else ()
        spec = spec + (None,) * (len(leaf.shape) - len(spec))
        _check_divisible(path, leaf.shape, spec, case)
        return NamedSharding(mesh, PartitionSpec(*spec))

    state_shardings = jax.tree_util.tree_map_with_path(
        sharding_for, state, logical_specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )
    batch_spec = input_spec(case)
    _check_divisible("inputs/tokens", batch_shape, tuple(batch_spec), case)
    batch_shardings = {name: NamedSharding(mesh, batch_spec) for name in ("tokens", "targets")}
    # The shardings ride on the abstract values too: with Explicit axes they are the arrays' types.
    placed = jax.tree.map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s), state, state_shardings
    )
    batch = {name: jax.ShapeDtypeStruct(batch_shape, jnp.int32, sharding=s) for name, s in batch_shardings.items()}
    return AbstractState(placed, batch, state_shardings, batch_shardings, logical)


def make_loss(case: Case):
    """The forward pass and next-token loss: (params, batch) → loss."""
    model = Transformer(case.model)

    def loss_of(params, batch):
        logits: Any = model.apply({"params": params}, batch["tokens"])
        return next_token_loss(logits, batch["targets"])

    return loss_of


def make_train_step(case: Case):
    """Forward, next-token loss, gradients and an AdamW update: the step that gets sharded."""
    loss_of = make_loss(case)
    optimizer = make_optimizer()

    def train_step(state, batch):
        loss, grads = jax.value_and_grad(loss_of)(state["params"], batch)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state}, {"loss": loss}

    return train_step


def sharding_context_for(case: Case, mesh: jax.sharding.Mesh) -> ShardingContext:
    """The context the models trace under: this case's mesh, rules and divisibility checks."""

    def validate(path: str, shape: Sequence[int], spec: PartitionSpec) -> None:
        _check_divisible(f"activations/{path}", shape, tuple(spec), case)

    return ShardingContext(
        mesh=mesh,
        resolve=_resolver(case),
        moe_strategy=case.preset.moe,
        pipeline=pipeline_settings(case),
        validate=validate,
    )


def pipeline_settings(case: Case) -> PipelineSettings | None:
    """The model-side pipeline settings, or None when the preset has no pipeline or its stage axis is 1."""
    pipeline = case.preset.pipeline
    if pipeline is None or case.mesh_sizes.get(pipeline.stages_axis, 1) == 1:
        return None
    return PipelineSettings(stage_axis=pipeline.stages_axis, microbatches=pipeline.microbatches)


def trace_case(case: Case) -> TracedStep:
    """Every tensor's sharding without lowering or compiling: the forward pass traced under the case's rules.

    Parameters, optimizer state and inputs are placed by the rules before any trace; activations are
    recorded as the forward pass is traced (the backward pass places none of its own); the step's outputs
    are what it declares (its out_shardings, which the compiled program keeps).

    Raises:
      ShardingError: a parameter, input or activation dimension its mesh axes do not divide.
      MeshError: the mesh needs more devices than this process has.
    """
    mesh = build_mesh(case.topology, case.mesh, explicit=case.preset.shard_mode == "explicit")
    abstract = abstract_state(case, mesh)
    forward = jax.jit(make_loss(case), in_shardings=(abstract.state_shardings["params"], abstract.batch_shardings))
    context = sharding_context_for(case, mesh)
    with sharding_context(context), jax.set_mesh(mesh):
        forward.trace(abstract.state["params"], abstract.batch)
    loss = jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
    return TracedStep(case, mesh, abstract, tuple(context.records), (abstract.state, {"loss": loss}))


def lower_case(case: Case) -> LoweredStep:
    """Traces and lowers the train step of a case on its mesh: every tensor's sharding, no compile.

    Raises:
      ShardingError: a parameter, input or activation dimension its mesh axes do not divide.
      MeshError: the mesh needs more devices than this process has.
    """
    mesh = build_mesh(case.topology, case.mesh, explicit=case.preset.shard_mode == "explicit")
    abstract = abstract_state(case, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    step = jax.jit(
        make_train_step(case),
        in_shardings=(abstract.state_shardings, abstract.batch_shardings),
        out_shardings=(abstract.state_shardings, {"loss": replicated}),
        donate_argnums=0,
    )
    context = sharding_context_for(case, mesh)
    # Explicit axes make shardings part of array types, which needs the mesh in context while tracing.
    with sharding_context(context), jax.set_mesh(mesh):
        lowered = step.lower(abstract.state, abstract.batch)
    return LoweredStep(case, mesh, abstract, lowered, tuple(context.records))


def compile_case(case: Case) -> CompiledStep:
    """Lowers and compiles the train step of a case on its mesh.

    Raises:
      ShardingError: a parameter, input or activation dimension its mesh axes do not divide.
      MeshError: the mesh needs more devices than this process has.
    """
    step = lower_case(case)
    options = compiler_options_for(case)
    try:
        compiled = step.lowered.compile(compiler_options=options)
    except jax.errors.JaxRuntimeError as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "RESOURCE_EXHAUSTED" not in message:
            raise
        # The TPU compiler refuses a program whose buffers exceed a device's memory.
        raise CompileError(
            f"{case.model_name} on {case.topology.name}: the compiler cannot fit the step in device memory "
            f"({message.removeprefix('RESOURCE_EXHAUSTED: ')}); lower --set model.per_device_batch=…, use more "
            "devices, or plan shardings alone with --tensors-only"
        ) from None
    return CompiledStep(case, step.mesh, step.abstract, step.lowered, compiled, step.activations, options)
