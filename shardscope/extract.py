"""Compiled step + trace records → Plan: tensors (params, opt_state, inputs, activations, outputs),
collectives (from the compiled HLO) and memory (from the compiler's memory analysis)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from reference_models.sharding import ActivationRecord, is_explicit
from shardscope.case import Case
from shardscope.collectives import extract_collectives
from shardscope.compile import CompiledStep, TracedStep, compile_case, path_of, trace_case
from shardscope.cost.work import step_work
from shardscope.hlo.module import read_module
from shardscope.hlo.records import Module
from shardscope.lint.run import plan_findings, with_findings
from shardscope.plan import SCHEMA, TENSORS_ONLY, CaseRecord, Plan, TensorRecord, tensor_record
from shardscope.rules import Spec, normalize_entry
from shardscope.topology import DCN_AXIS
from shardscope.tpu import libtpu_version


def normalize_spec(spec: Any, ndim: int) -> Spec:
    """A PartitionSpec as the plan's tuple: one entry per dimension, None / "axis" / ("a", "b")."""
    entries = tuple(normalize_entry(e) for e in tuple(spec))
    return entries + (None,) * (ndim - len(entries))


def _state_tensors(step: CompiledStep | TracedStep, mesh: dict[str, int]) -> dict[str, TensorRecord]:
    tensors: dict[str, TensorRecord] = {}
    abstract = step.abstract
    leaves = jax.tree_util.tree_flatten_with_path(abstract.state)[0]
    shardings = jax.tree_util.tree_leaves(abstract.state_shardings)
    for (key_path, leaf), sharding in zip(leaves, shardings, strict=True):
        path = path_of(key_path)
        kind = "param" if path.startswith("params/") else "opt_state"
        spec = normalize_spec(sharding.spec, len(leaf.shape))
        tensors[path] = tensor_record(kind, leaf.shape, leaf.dtype, abstract.logical.get(path), spec, mesh)
    for name, leaf in abstract.batch.items():
        spec = normalize_spec(abstract.batch_shardings[name].spec, len(leaf.shape))
        logical = step.case.preset.input_data_sharding_logical_axes
        tensors[f"inputs/{name}"] = tensor_record("input", leaf.shape, leaf.dtype, logical, spec, mesh)
    return tensors


def _activation_tensors(records: Sequence[ActivationRecord], mesh: dict[str, int]) -> dict[str, TensorRecord]:
    """One entry per traced constraint; a module traced twice (scan does) records the same entry twice."""
    tensors: dict[str, TensorRecord] = {}
    for record in records:
        spec = normalize_spec(record.spec, len(record.shape))
        entry = tensor_record("activation", record.shape, record.dtype, record.logical, spec, mesh)
        path = f"activations/{record.path}"
        suffix = 1
        while path in tensors and tensors[path] != entry:
            suffix += 1
            path = f"activations/{record.path}#{suffix}"
        tensors[path] = entry
    return tensors


def _output_tensors(
    out_info: Any, mesh: dict[str, int], logical: dict[str, tuple[str | None, ...]], train_step: bool
) -> dict[str, TensorRecord]:
    """The shardings the program returns: the compiled program's own, or the lowered one's (as requested).

    A train step returns (state, metrics), whose parts have distinct names, so its tuple index is left out
    of a tensor's name; any other function's outputs keep it (`(params, grads)` with the same keys are
    `outputs/0/w` and `outputs/1/w`), and a lone value is `outputs`.
    """
    tensors: dict[str, TensorRecord] = {}
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(out_info)[0]:
        path = path_of(key_path[1:] if train_step and isinstance(out_info, tuple) else key_path)
        spec = normalize_spec(spec_of(leaf.sharding), len(leaf.shape))
        name = f"outputs/{path}" if path else "outputs"
        tensors[name] = tensor_record("output", leaf.shape, leaf.dtype, logical.get(path), spec, mesh)
    return tensors


def spec_of(sharding: Any) -> Any:
    """A sharding's PartitionSpec; a program jitted without a mesh keeps each value on one device, whole."""
    return getattr(sharding, "spec", jax.sharding.PartitionSpec())


def _input_tensors(compiled: Any, mesh: dict[str, int]) -> dict[str, TensorRecord]:
    """Arguments of any compiled function, as the compiled program takes them."""
    tensors: dict[str, TensorRecord] = {}
    avals = jax.tree_util.tree_flatten_with_path(compiled.in_avals[0])[0]
    shardings = jax.tree_util.tree_leaves(compiled.input_shardings[0])
    for (key_path, aval), sharding in zip(avals, shardings, strict=True):
        spec = normalize_spec(spec_of(sharding), len(aval.shape))
        tensors[f"inputs/{path_of(key_path)}"] = tensor_record("input", aval.shape, aval.dtype, None, spec, mesh)
    return tensors


def _memory(compiled: Any) -> tuple[tuple[str, int], ...]:
    analysis = compiled.memory_analysis()
    if analysis is None:
        return ()
    return tuple(
        sorted(
            {
                "argument_bytes": int(analysis.argument_size_in_bytes),
                "output_bytes": int(analysis.output_size_in_bytes),
                "alias_bytes": int(analysis.alias_size_in_bytes),
                "temp_bytes": int(analysis.temp_size_in_bytes),
            }.items()
        )
    )


def provenance(platform: str, compiler_options: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Versions and backend: informational, never part of a diff verdict."""
    import flax
    import jaxlib
    import optax

    return tuple(
        sorted(
            {
                "jax": jax.__version__,
                "jaxlib": jaxlib.__version__,
                "flax": flax.__version__,
                "optax": optax.__version__,
                "backend": platform,
                "libtpu": libtpu_version() if platform == "tpu" else None,
                "compiler_options": dict(sorted(compiler_options.items())),
            }.items()
        )
    )


def slice_mesh(case: Case) -> tuple[tuple[str, int], ...]:
    """The mesh one compiled module's device groups refer to.

    A program for several TPU slices is compiled per slice: its replica groups number one slice's devices,
    and traffic between slices travels as host transfers (send/recv), which are not collectives here.
    """
    slices = case.topology.slices
    if slices == 1:
        return case.mesh
    return tuple((axis, size // slices if axis == DCN_AXIS else size) for axis, size in case.mesh)


def _step_tensors(step: CompiledStep | TracedStep, out_info: Any) -> tuple[tuple[str, TensorRecord], ...]:
    """Every tensor of a traced step, sorted by path; its outputs as `out_info` describes them."""
    mesh = step.case.mesh_sizes
    tensors = _state_tensors(step, mesh)
    tensors.update(_activation_tensors(step.activations, mesh))
    tensors.update(_output_tensors(out_info, mesh, step.abstract.logical, train_step=True))
    return tuple(sorted(tensors.items()))


def compute_of(module: Module) -> tuple[tuple[str, int], ...]:
    """The plan's `compute` section: per-device FLOPs and bytes accessed per step (`shardscope.cost.work`),
    and how many computations ran an unknown number of times (left out, so the figures are a floor)."""
    work = step_work(module)
    unknown = (("unknown_computations", work.unknown_computations),) if work.unknown_computations else ()
    return tuple(sorted(work.as_compute() + unknown))


def extract_plan(step: CompiledStep, hlo_text: str) -> Plan:
    """The plan of a compiled step, given the text of its compiled HLO module."""
    case = step.case
    module = read_module(hlo_text)
    return Plan(
        case=case.record(),
        provenance=provenance(case.topology.platform, step.compiler_options),
        tensors=_step_tensors(step, step.compiled.out_info),  # built afresh on every access: read once
        collectives=extract_collectives(module, slice_mesh(case)),
        memory=_memory(step.compiled),
        schema=SCHEMA,
        compute=compute_of(module),
    )


def extract_tensors_plan(step: TracedStep) -> Plan:
    """The tensors-only plan of a traced step: every tensor's sharding, no collectives or memory."""
    case = step.case
    return Plan(
        case=case.record(),
        provenance=provenance(case.topology.platform, {}),
        tensors=_step_tensors(step, step.out_info),
        schema=SCHEMA,
        parts=TENSORS_ONLY,
    )


def plan_case(case: Case, tensors_only: bool = False) -> Plan:
    """The whole `dump` pipeline after validation: lower (and unless `tensors_only`, compile), extract, and
    lint (the plan's `findings`)."""
    if tensors_only:
        traced = trace_case(case)
        plan = extract_tensors_plan(traced)
        return with_findings(plan, plan_findings(case, plan, traced.resolved))
    step = compile_case(case)
    plan = extract_plan(step, step.compiled.as_text())
    log = step.compiler_log if step.compiler_log_visible else None
    return with_findings(plan, plan_findings(case, plan, step.resolved, log))


def plan_from_compiled(compiled: Any, mesh: jax.sharding.Mesh, name: str, hlo_text: str | None = None) -> Plan:
    """The plan of any compiled JAX function: its inputs, outputs, collectives and memory.

    For golden tests of a project's own jitted functions (see the pytest plugin); `name` becomes the
    case's model and preset.
    """
    sizes = {str(axis): int(size) for axis, size in mesh.shape.items()}
    tensors = _input_tensors(compiled, sizes)
    tensors.update(_output_tensors(compiled.out_info, sizes, {}, train_step=False))
    explicit = is_explicit(mesh)
    devices = mesh.devices.flat[0]
    module = read_module(hlo_text or compiled.as_text())
    return Plan(
        case=CaseRecord(
            model=name,
            preset=name,
            topology=f"{devices.platform}-{mesh.size}",
            mesh=tuple(sizes.items()),
            axis_types="explicit" if explicit else "auto",
        ),
        provenance=provenance(devices.platform, {}),
        tensors=tuple(sorted(tensors.items())),
        collectives=extract_collectives(module, tuple(sizes.items())),
        memory=_memory(compiled),
        schema=SCHEMA,
        compute=compute_of(module),
    )
