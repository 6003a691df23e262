"""Topologies by name (`cpu-N`, TPU slices such as `v5p-16`, several slices `2xv5p-16`, GPU clusters such as
`h100-2x8`), the `--mesh` grammar
and a preset's mesh on a topology's devices (no JAX: the devices themselves are `shardscope.stages.devices`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardscope.case.gpu import (
    GPU_EXTRA_HINT,
    GpuCluster,
    gpu_plugin_version,
    is_gpu_name,
    known_gpu_names,
    parse_gpu_cluster,
    with_gpu_domains,
)
from shardscope.case.presets import Preset
from shardscope.case.tpu import TPU_EXTRA_HINT, TpuSlice, is_tpu_name, known_tpu_names, libtpu_version, parse_tpu_slice
from shardscope.errors import MeshError, ShardscopeError, unknown_name

# What a case compiles for when it names no topology. The front ends (the CLI's options, the library's and the
# pytest plugin's signatures) spell it out: importing this package there would load the model registry on
# every `--help` (about as long again as the rest of its start-up).
DEFAULT_TOPOLOGY = "cpu-8"
_CPU = re.compile(r"cpu-(\d+)")
MAX_CPU_DEVICES = 4096


@dataclass(frozen=True)
class Topology:
    """A named set of devices to compile for."""

    name: str
    platform: str  # "cpu", "tpu" or "gpu"
    num_devices: int
    tpu: TpuSlice | None = None
    # TPU slices joined over the data-center network (DCN); on a GPU cluster, its NVLink domains joined by the
    # network.
    slices: int = 1
    gpu: GpuCluster | None = None


_SLICES = re.compile(r"(\d+)x(.+)")
# The mesh axis that spans slices: data parallelism is what tolerates the slow links between them. A case
# may name another (`--set dcn_axis=fsdp`, as MaxText's `dcn_fsdp_parallelism` puts FSDP across slices).
DCN_AXIS = "data"
DCN_SETTING = "dcn_axis"


def dcn_axis_of(overrides: Mapping[str, str] | Sequence[tuple[str, str]]) -> str:
    """The mesh axis that spans a case's slices, from its settings (a plan's `case.overrides`); the setting as
    written where a GPU case lays its hosts over several (`dcn_axes_of`)."""
    return dict(overrides).get(DCN_SETTING, DCN_AXIS)


def dcn_axes_of(overrides: Mapping[str, str] | Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The mesh axes that span a case's slices: one (`fsdp`), or on a GPU cluster several (`data:2,fsdp:16`)."""
    return tuple(part.partition(":")[0].strip() for part in dcn_axis_of(overrides).split(","))


def dcn_parts(value: str, slices: int) -> tuple[tuple[str, int], ...]:
    """Each mesh axis that spans the slices with how many it spans, from a `dcn_axis` setting: one axis
    (`fsdp`: all the slices), or several with their counts (`data:2,fsdp:16`, as MaxText's `dcn_*_parallelism`
    sizes lay a GPU cluster's hosts; the counts multiply to the slices).

    Raises:
      MeshError: a malformed setting, an axis named twice, or counts whose product is not the slices.
    """
    parts = [part.strip() for part in value.split(",")]
    if len(parts) == 1 and ":" not in parts[0]:
        return ((parts[0], slices),)
    result: list[tuple[str, int]] = []
    for part in parts:
        name, sep, count = part.partition(":")
        if not sep or not name.strip() or not re.fullmatch(r"\d+", count.strip()) or int(count) < 1:
            raise MeshError(f"--set {DCN_SETTING}={value}: expected axis:count pairs like 'data:2,fsdp:16'")
        result.append((name.strip(), int(count)))
    names = [name for name, _ in result]
    if len(set(names)) != len(names):
        raise MeshError(f"--set {DCN_SETTING}={value}: an axis is named twice")
    product = math.prod(count for _, count in result)
    if product != slices:
        raise MeshError(
            f"--set {DCN_SETTING}={value}: the counts multiply to {product}, but the topology has {slices} "
            f"slices (NVLink domains)"
        )
    return tuple(result)


def check_spans_slices(sizes: Mapping[str, int], slices: int, axis: str) -> None:
    """Raises MeshError unless `axis` (of mesh `sizes`) divides among `slices` slices (one slice: any)."""
    if slices > 1 and sizes.get(axis, 1) % slices:
        raise MeshError(
            f"{slices} slices are joined over mesh axis {axis!r}, whose size {sizes.get(axis, 1)} is not a "
            f"multiple of {slices}; e.g. --mesh {axis}={slices}"
        )


def check_spans_parts(sizes: Mapping[str, int], parts: Sequence[tuple[str, int]]) -> None:
    """Raises MeshError unless each axis of `parts` (of mesh `sizes`) divides among the slices it spans."""
    for axis, count in parts:
        check_spans_slices(sizes, count, axis)


def get_topology(name: str, compiling: bool = True) -> Topology:
    """Parses a topology name: `cpu-N` (N fake host devices), a TPU slice (`v5p-16`, `tpu7x-8`, …), or
    several TPU slices (`2xv5p-16`, as `--slices 2` writes it), or a GPU cluster (`h100-2x8`: 2 hosts of 8).

    `compiling=False`: a name that will not be compiled for here (a stored plan's), without its extra.

    Raises:
      ShardscopeError: an unknown name, or a TPU slice (GPU cluster) without the TPU (GPU) extra installed.
    """
    slices = _SLICES.fullmatch(name)
    if slices and is_tpu_name(slices.group(2)):
        count = int(slices.group(1))
        if count < 1:
            raise ShardscopeError(f"topology {name!r}: the number of slices must be at least 1")
        one = get_topology(slices.group(2), compiling)
        return Topology(name=name, platform="tpu", num_devices=one.num_devices * count, tpu=one.tpu, slices=count)
    match = _CPU.fullmatch(name)
    if match:
        count = int(match.group(1))
        if not 1 <= count <= MAX_CPU_DEVICES:
            raise ShardscopeError(f"topology {name!r}: device count must be 1..{MAX_CPU_DEVICES}")
        return Topology(name=name, platform="cpu", num_devices=count)
    if is_tpu_name(name):
        tpu = parse_tpu_slice(name)
        if compiling and libtpu_version() is None:
            raise ShardscopeError(f"topology {name!r} compiles for TPU, which needs libtpu: {TPU_EXTRA_HINT}")
        return Topology(name=name, platform="tpu", num_devices=tpu.num_devices, tpu=tpu)
    if is_gpu_name(name):
        gpu = parse_gpu_cluster(name)
        if compiling and gpu_plugin_version() is None:
            raise ShardscopeError(
                f"topology {name!r} compiles for NVIDIA GPUs, which needs JAX's CUDA plugin: {GPU_EXTRA_HINT}"
            )
        return Topology(name=name, platform="gpu", num_devices=gpu.num_devices, slices=gpu.domains, gpu=gpu)
    raise unknown_name(
        "topology",
        name,
        ["cpu-8", "cpu-N", *known_tpu_names(), "KxTPU (e.g. 2xv5p-16)", *known_gpu_names(), "GEN-HOSTSxGPUS"],
    )


def needs_libtpu(name: str) -> bool:
    """Whether a topology name compiles for TPU (`v5p-16`, `2xv5p-16`), which needs the TPU extra."""
    slices = _SLICES.fullmatch(name)
    return is_tpu_name(slices.group(2) if slices else name)


def needs_gpu_plugin(name: str) -> bool:
    """Whether a topology name compiles for NVIDIA GPUs (`h100-2x8`), which needs the GPU extra."""
    return is_gpu_name(name)


def with_slices(topology: str, slices: int) -> str:
    """The topology name `--slices K` stands for: K copies of a TPU slice (`2xv5p-16`), or K NVLink domains of
    a GPU cluster (`h100-1x8` → `h100-2x8`)."""
    if slices == 1:
        return topology
    if slices > 1 and is_gpu_name(topology):
        return with_gpu_domains(topology, slices)
    if slices < 1 or not is_tpu_name(topology):
        raise ShardscopeError(f"--slices {slices}: applies to a single TPU slice name such as v5p-16, not {topology!r}")
    return f"{slices}x{topology}"


def parse_mesh_arg(text: str) -> dict[str, int]:
    """Parses `fsdp=4,expert=2` (sizes may be -1 = fill the remaining devices)."""
    sizes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not re.fullmatch(r"-?\d+", value.strip()) or not name.strip():
            raise MeshError(f"--mesh {text!r}: expected axis=size pairs like 'fsdp=4,expert=2', found {part!r}")
        size = int(value)
        if size == 0 or size < -1:
            raise MeshError(f"--mesh {text!r}: size of {name.strip()!r} must be positive or -1, found {size}")
        sizes[name.strip()] = size
    return sizes


def resolve_mesh(preset: Preset, num_devices: int, overrides: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Mesh axis sizes for a preset on `num_devices`: preset defaults, then `--mesh` overrides.

    Axes with no size anywhere are 1. One axis may be -1 and takes the remaining devices. If the preset sets
    no -1 and the user gives sizes, `fsdp` (or the first axis) is not silently stretched: the product must
    match the devices exactly.

    Raises:
      MeshError: an override names an axis the preset lacks, two axes are -1, or the mesh does not fit.
    """
    for axis in overrides:
        if axis not in preset.mesh_axes:
            raise MeshError(f"--mesh names a missing mesh axis: {unknown_name('axis', axis, preset.mesh_axes).args[0]}")
    sizes = {axis: 1 for axis in preset.mesh_axes}
    defaults = dict(preset.mesh)
    if not defaults:
        # A MaxText rule file has no sizes: FSDP (or the first axis) takes every device.
        defaults = {"fsdp" if "fsdp" in preset.mesh_axes else preset.mesh_axes[0]: -1}
    sizes.update(defaults)
    if any(v == -1 for v in overrides.values()):
        sizes = {axis: (1 if size == -1 else size) for axis, size in sizes.items()}
    sizes.update(overrides)
    fill = [axis for axis, size in sizes.items() if size == -1]
    if len(fill) > 1:
        raise MeshError(f"mesh {format_mesh(sizes)}: only one axis may be -1, found {', '.join(fill)}")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if fill:
        if num_devices % fixed:
            raise MeshError(
                f"mesh {format_mesh(sizes)} does not fit {num_devices} devices: the fixed axes use {fixed}, "
                f"which does not divide {num_devices}; change --mesh or --topology"
            )
        sizes[fill[0]] = num_devices // fixed
    elif fixed != num_devices:
        raise MeshError(
            f"mesh {format_mesh(sizes)} uses {fixed} devices but the topology has {num_devices}; "
            f"set one axis to -1 (e.g. --mesh fsdp=-1) or pick --topology cpu-{fixed}"
        )
    return tuple((axis, sizes[axis]) for axis in preset.mesh_axes)


def format_mesh(sizes: Mapping[str, int] | Sequence[tuple[str, int]]) -> str:
    """The mesh as the CLI spells it: `data=1,fsdp=4,expert=2` (order matters: it places devices)."""
    items = sizes.items() if isinstance(sizes, Mapping) else sizes
    return ",".join(f"{axis}={size}" for axis, size in items)


def mesh_label(mesh: Mapping[str, int] | Sequence[tuple[str, int]]) -> str:
    """The mesh for a reader: the axes that split devices, then how many axes have size 1.

    MaxText's default mesh has twelve axes, most of them of size 1 on any one run:
    "fsdp=4,expert=2 (+10 axes of size 1)".
    """
    axes = tuple(mesh.items() if isinstance(mesh, Mapping) else mesh)
    shown = ",".join(f"{axis}={size}" for axis, size in axes if size != 1) or "one device"
    idle = sum(1 for _, size in axes if size == 1)
    return shown + (f" (+{idle} {'axis' if idle == 1 else 'axes'} of size 1)" if idle else "")
