"""A plan priced where it will run: which hardware, which slice, and the plan with its `estimate` section.

Everything here reads the plan alone (no JAX, no devices): a TPU plan prices as its own generation on its
own slice shape; a `cpu-N` plan prices only when a generation is named, on that generation's standard
slice of N devices. The layout follows the device order `mesh_utils.create_device_mesh` gives, which is
how shardscope builds TPU meshes (`layout_for` is checked against real device coordinates in the tests).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from shardscope.case.gpu import is_gpu_name
from shardscope.case.hardware import Hardware, HardwareError, load_hardware
from shardscope.case.topology import DCN_AXIS, dcn_axis_of
from shardscope.case.tpu import is_tpu_name, parse_tpu_slice
from shardscope.cost.estimate import estimate_plan
from shardscope.cost.gpu import estimate_gpu_plan
from shardscope.cost.layout import Layout, layout_for
from shardscope.plan.document import Plan
from shardscope.plan.estimate import Estimate
from shardscope.predict import is_predicted

_SLICES = re.compile(r"(?:(\d+)x)?(.+)")


@dataclass(frozen=True)
class Target:
    """Where a plan is priced: a generation, its slice shape and how many slices."""

    hardware: Hardware
    slice_shape: tuple[int, ...] | None  # None: the generation's standard slice for the mesh
    slices: int

    @property
    def label(self) -> str:
        """ "v5p 2x2x2" or "2 × v5p 2x2x2", for headlines."""
        shape = "x".join(map(str, self.slice_shape)) if self.slice_shape else "standard slice"
        one = f"{self.hardware.name} {shape}"
        return one if self.slices == 1 else f"{self.slices} × {one}"


def tpu_of_topology(topology: str) -> tuple[str, tuple[int, ...], int] | None:
    """(generation, slice shape in chips, slices) of a TPU topology name (`v5p-16`, `2xv5p-16`), else None."""
    match = _SLICES.fullmatch(topology)
    if match is None or not is_tpu_name(match.group(2)):
        return None
    tpu = parse_tpu_slice(match.group(2))
    shape = tuple(int(d) for d in tpu.topology_name.split(":")[1].split("x"))
    generation = load_hardware(match.group(2)).name
    return generation, shape, int(match.group(1) or 1)


def target_for(plan_topology: str, hardware: str | None) -> Target | None:
    """The target a plan of `plan_topology` prices on: the named generation, else the topology's own.

    Raises:
      HardwareError: an unknown generation or a broken hardware table entry.
    """
    own = tpu_of_topology(plan_topology)
    if hardware is None:
        if own is None:
            return None
        return Target(load_hardware(own[0]), own[1], own[2])
    chosen = load_hardware(hardware)
    if own is not None and own[0] == chosen.name:
        return Target(chosen, own[1], own[2])
    return Target(chosen, None, own[2] if own is not None else 1)


def check_pricing(
    topology: str,
    mesh: tuple[tuple[str, int], ...],
    hardware: str | None,
    efficiency: float | None,
    dcn_axis: str = DCN_AXIS,
) -> Target | None:
    """Validates what `price_plan` will be asked before anything compiles: the generation, the efficiency,
    and that the mesh is a slice of it (over several slices, `dcn_axis` spanning them). Returns the target
    (None: a CPU plan with no hardware named).

    Raises:
      HardwareError / MeshError: as `price_plan`.
    """
    if is_gpu_name(topology):
        check_gpu_pricing(topology, hardware, efficiency)
        return None
    target = target_for(topology, hardware)
    if target is None:
        if efficiency is not None:
            raise HardwareError(f"--efficiency prices a plan: a {topology} plan is priced only with --hardware")
        return None
    if efficiency is not None and not 0 < efficiency <= 1:
        raise HardwareError(f"--efficiency must be in (0, 1], found {efficiency}")
    layout_for(target.hardware, mesh, slices=target.slices, slice_shape=target.slice_shape, dcn_axis=dcn_axis)
    return target


def check_gpu_pricing(topology: str, hardware: str | None, efficiency: float | None) -> None:
    """A GPU cluster's plan prices on its own GPUs, at the table's efficiency.

    Raises:
      HardwareError: another generation or an efficiency is asked for.
    """
    own = topology.split("-", 1)[0]
    if hardware is not None and hardware != own:
        raise HardwareError(f"--hardware {hardware}: a plan for GPU cluster {topology} prices only on its own {own}")
    if efficiency is not None:
        raise HardwareError(
            f"--efficiency: a plan for GPU cluster {topology} prices at the hardware table's efficiency"
        )


def layout_of(plan: Plan, target: Target) -> Layout:
    """The plan's mesh on the target (raises MeshError/HardwareError when it does not fit the slice)."""
    return layout_for(
        target.hardware,
        plan.case.mesh,
        slices=target.slices,
        slice_shape=target.slice_shape,
        dcn_axis=dcn_axis_of(plan.case.overrides),
    )


def estimate_of(plan: Plan, target: Target, efficiency: float | None = None) -> Estimate:
    """The plan's estimate on a target, from its collectives, its compute figures and its tensors."""
    compute = dict(plan.compute)
    own = tpu_of_topology(plan.case.topology)
    predicted = is_predicted(plan)
    return estimate_plan(
        plan,
        target.hardware,
        layout_of(plan, target),
        efficiency=efficiency,
        flops=compute.get("flops"),
        bytes_accessed=compute.get("bytes_accessed"),
        exact_memory=own is not None and own[0] == target.hardware.name and not predicted,
        work=plan.work,
        route=PREDICTION_ROUTE.format(target.hardware.name)
        if predicted
        else route_of(plan.case.topology, target.hardware.name),
        cpu_program=own is None and not predicted,
    )


PREDICTION_ROUTE = "prediction (no compile) priced as {}"


def route_of(topology: str, generation: str) -> str:
    """Which compile a plan's figures come from: "TPU compile" (its own topology's compiler) or "CPU
    compile priced as v5p" (another platform's program, priced on a TPU's figures)."""
    own = tpu_of_topology(topology)
    if own is None:
        return f"CPU compile priced as {generation}"
    if own[0] == generation:
        return "TPU compile"
    return f"{own[0]} compile priced as {generation}"


def price_plan(plan: Plan, hardware: str | None = None, efficiency: float | None = None) -> Plan:
    """The plan with its `estimate` section: on `hardware` (a generation name) or on its own TPU topology.

    A CPU plan with no hardware named is returned unpriced (without an estimate). A GPU cluster's plan prices
    on its own GPUs only (`shardscope.cost.gpu`, uncalibrated).

    Raises:
      HardwareError / MeshError: an unknown generation, an efficiency outside (0, 1], or a mesh that is not
        a slice of that generation; a GPU plan given another generation or an efficiency.
    """
    if is_gpu_name(plan.case.topology):
        check_gpu_pricing(plan.case.topology, hardware, efficiency)
        return dataclasses.replace(plan, estimate=estimate_gpu_plan(plan))
    target = check_pricing(plan.case.topology, plan.case.mesh, hardware, efficiency, dcn_axis_of(plan.case.overrides))
    if target is None:
        return dataclasses.replace(plan, estimate=None)
    return dataclasses.replace(plan, estimate=estimate_of(plan, target, efficiency))
