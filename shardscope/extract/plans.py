"""Compiled (or traced) step → Plan: its tensors, the collectives of its compiled HLO, the compiler's memory
figures and the step's work per device; and the same for any compiled JAX function."""

from __future__ import annotations

from typing import Any

import jax

from reference_models.sharding import is_explicit
from shardscope.case.resolve import Case
from shardscope.case.tpu import libtpu_version
from shardscope.extract.collectives import extract_collectives
from shardscope.extract.links import with_links
from shardscope.extract.tensors import input_tensors, output_tensors, step_tensors
from shardscope.hlo.executions import Program
from shardscope.hlo.module import gc_paused, read_module
from shardscope.hlo.profile import work_profile
from shardscope.hlo.records import Module
from shardscope.hlo.work import step_work
from shardscope.plan.document import Plan
from shardscope.plan.records import SCHEMA, TENSORS_ONLY, CaseRecord, case_record
from shardscope.stages.compile import CompiledStep, TracedStep


def memory_of(compiled: Any, platform: str) -> tuple[tuple[str, int], ...]:
    analysis = compiled.memory_analysis()
    if analysis is None:
        return ()
    figures = {
        "argument_bytes": int(analysis.argument_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
        "alias_bytes": int(analysis.alias_size_in_bytes),
        "temp_bytes": int(analysis.temp_size_in_bytes),
    }
    # The TPU compiler's peak of live HBM (its heap simulation of the scheduled program): what the step
    # needs, and what a memory profile of the run shows. The sum of the four figures above counts
    # temporaries that are never alive together, so it over-states the need. Recorded for TPU compiles
    # only: a CPU compiler's peak says nothing about a TPU (plans of the CPU route keep their four figures).
    peak = int(getattr(analysis, "peak_memory_in_bytes", 0) or 0)
    if platform == "tpu" and peak:
        figures["peak_bytes"] = peak
    # Host memory a remat policy offloads to (TPU: pinned host); recorded only when there is some, so plans
    # without offload keep their four figures.
    host = int(getattr(analysis, "host_temp_size_in_bytes", 0) or 0)
    if host:
        figures["host_temp_bytes"] = host
    return tuple(sorted(figures.items()))


def provenance(platform: str, compiler_options: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Versions and backend: informational, never part of a diff verdict."""
    import flax  # lazy: versions read only when a plan is made
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
    and traffic between slices travels as host transfers (send/recv), which are not collectives here. A GPU
    cluster's program is one for every GPU: its groups number them all.
    """
    slices = case.topology.slices
    if slices == 1 or case.topology.gpu is not None:
        return case.mesh
    return tuple((axis, size // slices if axis == case.dcn_axis else size) for axis, size in case.mesh)


def compute_of(module: Module, program: Program | None = None) -> tuple[tuple[str, int], ...]:
    """The plan's `compute` section: per-device FLOPs and bytes accessed per step (`shardscope.hlo.work`),
    and how many computations ran an unknown number of times (left out, so the figures are a floor)."""
    work = step_work(module, program)
    unknown = (("unknown_computations", work.unknown_computations),) if work.unknown_computations else ()
    return tuple(sorted(work.as_compute() + unknown))


def extract_plan(step: CompiledStep, hlo_text: str) -> Plan:
    """The plan of a compiled step, given the text of its compiled HLO module.

    The cycle collector is paused throughout, not only while the module is read (`gc_paused`): every reader
    after it (collectives, work, causes) also makes records without cycles by the hundred thousand."""
    with gc_paused():
        return _extract_plan(step, hlo_text)


def _extract_plan(step: CompiledStep, hlo_text: str) -> Plan:
    case = step.case
    module = read_module(hlo_text)
    program = Program(module)  # its tables and executions, read once for the compute and the work profile
    tensors = step_tensors(step, step.compiled.out_info)  # built afresh on every access: read once
    explain = (dict(tensors), case.preset.logical_axis_rules)
    # A CPU program is read as the TPU would run it; where a loop's sums are taken depends on who asks for
    # them (`shardscope.hlo.accumulation`): the partitioner (Auto axes) or the program (Explicit).
    cpu, explicit = case.topology.platform == "cpu", case.axis_types == "explicit"
    collectives = extract_collectives(
        module, slice_mesh(case), narrow=cpu, explain=explain, moved_out=cpu and not explicit, program=program
    )
    if case.topology.gpu is not None:
        collectives = with_links(collectives, step.mesh, case.topology.gpu)
    return Plan(
        case=case_record(case),
        provenance=provenance(case.topology.platform, step.compiler_options),
        tensors=tensors,
        collectives=collectives,
        memory=memory_of(step.compiled, case.topology.platform),
        schema=SCHEMA,
        compute=compute_of(module, program),
        work=work_profile(module, cpu_program=cpu, explicit_reductions=explicit, program=program),
    )


def extract_tensors_plan(step: TracedStep) -> Plan:
    """The tensors-only plan of a traced step: every tensor's sharding, no collectives or memory."""
    case = step.case
    return Plan(
        case=case_record(case),
        provenance=provenance(case.topology.platform, {}),
        tensors=step_tensors(step, step.out_info),
        schema=SCHEMA,
        parts=TENSORS_ONLY,
    )


def plan_from_compiled(compiled: Any, mesh: jax.sharding.Mesh, name: str, hlo_text: str | None = None) -> Plan:
    """The plan of any compiled JAX function: its inputs, outputs, collectives and memory.

    For golden tests of a project's own jitted functions (see the pytest plugin); `name` becomes the
    case's model and preset.
    """
    sizes = {str(axis): int(size) for axis, size in mesh.shape.items()}
    tensors = input_tensors(compiled, sizes)
    tensors.update(output_tensors(compiled.out_info, sizes, {}, train_step=False))
    explicit = is_explicit(mesh)
    devices = mesh.devices.flat[0]
    module = read_module(hlo_text or compiled.as_text())
    program = Program(module)
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
        memory=memory_of(compiled, devices.platform),
        schema=SCHEMA,
        compute=compute_of(module, program),
        # Priced op by op as every compiled plan is (a user's program and a reference model's alike).
        work=work_profile(module, cpu_program=devices.platform == "cpu", explicit_reductions=explicit, program=program),
    )
