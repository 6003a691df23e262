"""Model + preset + mesh → abstract state → jitted train step → Lowered → Compiled.

The only module that calls jit/lower/compile. State is abstract (`jax.eval_shape`), so real model
shapes are planned without allocating a byte of parameters. Every tensor's sharding is known once the
step is lowered (`lower_case`); the compile adds the collectives and memory (`compile_case`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from reference_models.config import PipelineSettings
from reference_models.sharding import ActivationRecord, ShardingContext, sharding_context
from shardscope.case.presets import stage_as_data
from shardscope.case.resolve import Case, compiler_options_for
from shardscope.case.rules import Indivisible
from shardscope.errors import MemoryExhaustedError, ShardscopeError
from shardscope.stages.compiler_log import capture_compiler_log
from shardscope.stages.devices import build_mesh
from shardscope.stages.state import (
    AbstractState,
    LogicalAxes,
    abstract_state,
    check_divisible,
    resolver,
    unplaced_state,
)
from shardscope.stages.train_step import make_loss, make_train_step


@dataclass(frozen=True)
class LoweredStep:
    """The lowered (not compiled) train step and what was recorded while tracing it."""

    case: Case
    mesh: jax.sharding.Mesh
    abstract: AbstractState
    lowered: Any
    activations: tuple[ActivationRecord, ...]
    resolved: frozenset[LogicalAxes] = frozenset()
    jaxpr: Any = None  # the traced program (a ClosedJaxpr), kept only for a step that runs (`with_grads`)


@dataclass(frozen=True)
class TracedStep:
    """The forward pass traced (not lowered) on the case's mesh: every activation placement, and the
    train step's declared outputs."""

    case: Case
    mesh: jax.sharding.Mesh
    abstract: AbstractState
    activations: tuple[ActivationRecord, ...]
    out_info: Any  # (state, {"loss": …}) of ShapeDtypeStruct with the step's out_shardings
    resolved: frozenset[LogicalAxes] = frozenset()  # every logical-axes tuple the forward pass resolved
    indivisible: tuple[Indivisible, ...] = ()  # only from a lenient trace
    stopped: str | None = None  # a lenient trace the model could not finish: why (its records are partial)


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
    resolved: frozenset[LogicalAxes] = frozenset()
    compiler_log: str = ""  # what the compiler wrote to stderr while compiling (its warnings)
    compiler_log_visible: bool = field(default=True)  # whether its warnings could reach stderr at all
    jaxpr: Any = None  # the traced program (a ClosedJaxpr), kept only for a step that runs (`with_grads`)


def sharding_context_for(
    case: Case, mesh: jax.sharding.Mesh, found: list[Indivisible] | None = None
) -> ShardingContext:
    """The context the models trace under: this case's mesh, rules and divisibility checks (lenient with
    `found`, as in `abstract_state`). It records every logical-axes tuple the model resolves."""

    def validate(path: str, shape: Sequence[int], spec: PartitionSpec) -> PartitionSpec | None:
        entries = tuple(spec) + (None,) * (len(shape) - len(spec))
        placed = check_divisible(f"activations/{path}", shape, entries, case, found)
        return None if placed == entries else PartitionSpec(*placed)

    resolved: set[LogicalAxes] = set()
    pipeline = pipeline_settings(case)
    outside = None
    if pipeline is not None:
        outside = resolver(case, resolved, stage_as_data(case.preset.logical_axis_rules, pipeline.stage_axis))
    return ShardingContext(
        mesh=mesh,
        resolve=resolver(case, resolved),
        moe_strategy=case.preset.moe,
        pipeline=pipeline,
        resolve_outside_pipeline=outside,
        validate=validate,
        resolved=resolved,
    )


def pipeline_settings(case: Case) -> PipelineSettings | None:
    """The model-side pipeline settings, or None when the preset has no pipeline or its stage axis is 1."""
    pipeline = case.preset.pipeline
    if pipeline is None or case.mesh_sizes.get(pipeline.stage_axis, 1) == 1:
        return None
    return pipeline


def trace_case(case: Case, lenient: bool = False) -> TracedStep:
    """Every tensor's sharding without lowering or compiling: the forward pass traced under the case's rules.

    Parameters, optimizer state and inputs are placed by the rules before any trace; activations are
    recorded as the forward pass is traced (the backward pass places none of its own); the step's outputs
    are what it declares (its out_shardings, which the compiled program keeps).

    Args:
      case: the case.
      lenient: record tensors whose mesh axes do not divide them (`TracedStep.indivisible`) and trace on
        with those dimensions replicated, instead of raising (what `lint` needs to report them all). Where
        the model itself cannot go on (a shard_map over an indivisible dimension), the trace stops there and
        says so (`TracedStep.stopped`).

    Raises:
      ShardingError: a parameter, input or activation dimension its mesh axes do not divide (not lenient).
      MeshError: the mesh needs more devices than this process has.
    """
    found: list[Indivisible] | None = [] if lenient else None
    mesh = build_mesh(case.topology, case.mesh, case.preset.shard_mode == "explicit", case.dcn_axis)
    abstract = abstract_state(case, mesh, found)
    forward = jax.jit(make_loss(case), in_shardings=(abstract.state_shardings["params"], abstract.batch_shardings))
    context = sharding_context_for(case, mesh, found)
    stopped = None
    with sharding_context(context), jax.set_mesh(mesh):
        try:
            forward.trace(abstract.state["params"], abstract.batch)
        except ValueError as err:
            if not found:
                raise
            stopped = str(err).strip().splitlines()[0]
    loss = jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
    out_info = (abstract.state, {"loss": loss})
    resolved = frozenset(context.resolved)
    indivisible = tuple(found or ())
    return TracedStep(case, mesh, abstract, tuple(context.records), out_info, resolved, indivisible, stopped)


def lower_case(case: Case, with_grads: bool = False) -> LoweredStep:
    """Traces and lowers the train step of a case on its mesh: every tensor's sharding, no compile.

    `with_grads`: the step also returns its gradients (`metrics["grads"]`, stored as the parameters are,
    where the update reads them, so the compiler's collectives stay the plan's), and the traced program is
    kept (`LoweredStep.jaxpr`): what `shardscope verify` runs and reads.

    Raises:
      ShardingError: a parameter, input or activation dimension its mesh axes do not divide.
      MeshError: the mesh needs more devices than this process has.
    """
    mesh = build_mesh(case.topology, case.mesh, case.preset.shard_mode == "explicit", case.dcn_axis)
    abstract = abstract_state(case, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    metrics: dict[str, Any] = {"loss": replicated}
    if with_grads:
        metrics["grads"] = abstract.state_shardings["params"]
    step = jax.jit(
        make_train_step(case, abstract.zero1, with_grads),
        in_shardings=(abstract.state_shardings, abstract.batch_shardings),
        out_shardings=(abstract.state_shardings, metrics),
        donate_argnums=0,
    )
    context = sharding_context_for(case, mesh)
    # Explicit axes make shardings part of array types, which needs the mesh in context while tracing.
    with sharding_context(context), jax.set_mesh(mesh):
        traced = step.trace(abstract.state, abstract.batch)
        lowered = traced.lower()
    jaxpr = traced.jaxpr if with_grads else None
    return LoweredStep(case, mesh, abstract, lowered, tuple(context.records), frozenset(context.resolved), jaxpr)


def compile_case(case: Case, with_grads: bool = False) -> CompiledStep:
    """Lowers and compiles the train step of a case on its mesh (`with_grads`: as `lower_case`).

    Raises:
      ShardingError: a parameter, input or activation dimension its mesh axes do not divide.
      MeshError: the mesh needs more devices than this process has.
    """
    step = lower_case(case, with_grads)
    options = compiler_options_for(case)
    try:
        # The compiler's warnings (involuntary rematerialisation, …) are read by lints.
        with capture_compiler_log() as log:
            compiled = step.lowered.compile(compiler_options=options)
    except jax.errors.JaxRuntimeError as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        unknown = re.search(r"No such compile option: '([^']+)'", message)
        if unknown is not None:
            raise ShardscopeError(
                f"--set xla.{unknown.group(1)}: the {case.topology.name} compiler has no such option"
            ) from None
        if "Couldn't find output tile sizes" in message:
            # XLA's GPU compiler finds no Triton tiling for a matmul (seen on B200): cuBLAS compiles it.
            raise ShardscopeError(
                f"{case.model_name} on {case.topology.name}: the GPU compiler found no Triton tiling for a matmul; "
                "compile the matmuls with cuBLAS, as MaxText's GPU runs do: --set xla.xla_gpu_enable_triton_gemm=false"
            ) from None
        if "RESOURCE_EXHAUSTED" not in message:
            raise
        if "VmemOom" in message:
            # A kernel's blocks need more of a core's vector memory than the compiler lets a kernel have.
            raise MemoryExhaustedError(
                f"{case.model_name} on {case.topology.name}: a kernel needs more vector memory than the compiler "
                f"allows ({message.removeprefix('RESOURCE_EXHAUSTED: ')}); raise it with --set "
                "xla.xla_tpu_scoped_vmem_limit_kib=… (as MaxText's runs do) or use smaller attention blocks"
            ) from None
        # The TPU compiler refuses a program whose buffers exceed a device's memory.
        raise MemoryExhaustedError(
            f"{case.model_name} on {case.topology.name}: the compiler cannot fit the step in device memory "
            f"({message.removeprefix('RESOURCE_EXHAUSTED: ')}); lower --set model.per_device_batch=…, use more "
            "devices, or plan shardings alone with --tensors-only"
        ) from None
    return CompiledStep(
        case,
        step.mesh,
        step.abstract,
        step.lowered,
        compiled,
        step.activations,
        options,
        step.resolved,
        log.text,
        log.visible,
        step.jaxpr,
    )


@dataclass(frozen=True)
class OneDeviceStep:
    """A case's train step compiled for one device with no mesh and no constraints (the models run unsharded
    outside a sharding context), returning its gradients too: what a sharded step is verified against."""

    case: Case
    device: Any
    compiled: Any
    jaxpr: Any  # the traced program (a ClosedJaxpr)


def compile_one_device(case: Case, device: Any) -> OneDeviceStep:
    """The case's train step (with its gradients as outputs) traced, lowered and compiled for `device` alone."""
    state, batch = unplaced_state(case)
    step = jax.jit(make_train_step(case, with_grads=True), donate_argnums=0)
    with jax.default_device(device):
        traced = step.trace(state, batch)
        compiled = traced.lower().compile(compiler_options=compiler_options_for(case))
    return OneDeviceStep(case, device, compiled, traced.jaxpr)
