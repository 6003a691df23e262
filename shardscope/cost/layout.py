"""Mesh axes → the physical network: which torus dimensions each axis walks, with what stride, whether
its rings close through wraparound links, and whether it crosses slices (DCN).

Two sources give the same record: the devices of a real TPU mesh (`layout_from_mesh`, their `coords`,
`core_on_chip` and `slice_index`), or a generation's standard slice for the mesh's device count, laid
out by the rule `jax.experimental.mesh_utils.create_device_mesh` follows (`layout_for`; no JAX needed):
mesh axes are placed from the last (the most network-intensive by that convention) to the first, each on
as many whole physical dimensions as multiply to its size, and a dimension is split (inner factor first)
only when no set of whole ones fits. On TPU7x the two devices of a chip form the first dimension tried,
as `mesh_utils`' TPU7x handler gives the fastest link to the last axis. Multi-slice meshes put the `data`
axis across slices, as `create_hybrid_device_mesh` does in `shardscope.topology`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardscope.case.hardware import Hardware, HardwareError, load_hardware
from shardscope.case.topology import DCN_AXIS, check_spans_slices, format_mesh
from shardscope.case.tpu import GENERATIONS, known_tpu_names, parse_tpu_slice
from shardscope.errors import MeshError, ShardscopeError

TORUS = ("x", "y", "z")
CORE = "core"  # the devices of one chip (TPU7x: two dies joined on the package)
SLICE = "slice"  # slices joined over the data-center network

# device_kind → hardware table name.
DEVICE_KINDS = {
    "TPU v4": "v4",
    "TPU v5": "v5p",
    "TPU v5p": "v5p",
    "TPU v5 lite": "v5e",
    "TPU v5e": "v5e",
    "TPU v6 lite": "v6e",
    "TPU v6e": "v6e",
    "TPU7x": "tpu7x",
}


@dataclass(frozen=True)
class Span:
    """The part of one physical dimension that a mesh axis (or a group of axes) walks.

    `stride` > 1 means the axis's neighbours are `stride` chips apart: the axis shares that dimension
    with an inner axis, whose groups use the same links at the same time.
    """

    dim: str  # "x" / "y" / "z", CORE or SLICE
    extent: int  # members along this dimension
    stride: int  # physical step between consecutive members
    length: int  # the dimension's full length in the slice (or slice count)
    wrap: bool  # the dimension has wraparound links

    @property
    def closes(self) -> bool:
        """A ring that uses the wraparound: the span covers the whole wrapped dimension."""
        return self.wrap and self.extent > 1 and self.extent * self.stride == self.length


@dataclass(frozen=True)
class AxisLayout:
    """Where one mesh axis lives."""

    name: str
    size: int
    spans: tuple[Span, ...]

    @property
    def crosses_slices(self) -> bool:
        """Whether the axis's groups span several slices (DCN)."""
        return any(span.dim == SLICE for span in self.spans)

    @property
    def dims(self) -> tuple[str, ...]:
        """The physical dimensions the axis walks."""
        return tuple(span.dim for span in self.spans)


@dataclass(frozen=True)
class Layout:
    """Every mesh axis of a mesh on one generation's slice (or several slices)."""

    hardware: str
    slice_shape: tuple[int, ...]  # chips per torus dimension
    slices: int
    devices_per_chip: int
    axes: tuple[AxisLayout, ...]
    source: str  # "devices" (a real mesh) or "standard slice" (`layout_for`)

    def axis(self, name: str) -> AxisLayout:
        """One axis by name.

        Raises:
          MeshError: the mesh has no such axis.
        """
        for axis in self.axes:
            if axis.name == name:
                return axis
        raise MeshError(f"layout has no mesh axis {name!r} (axes: {', '.join(a.name for a in self.axes)})")

    def group(self, axes: Iterable[str], within_slice: bool = False) -> tuple[Span, ...]:
        """The spans of a device group over `axes`, merged per physical dimension.

        Two axes on one dimension (an inner and an outer factor) merge into one span: extents multiply,
        the finer stride stays. `within_slice` drops the cross-slice part (a plan compiled per slice
        numbers one slice's devices only).
        """
        merged: dict[str, Span] = {}
        for name in axes:
            for span in self.axis(name).spans:
                if within_slice and span.dim == SLICE:
                    continue
                old = merged.get(span.dim)
                if old is None:
                    merged[span.dim] = span
                else:
                    merged[span.dim] = Span(
                        span.dim, old.extent * span.extent, min(old.stride, span.stride), span.length, span.wrap
                    )
        order = (CORE, *TORUS, SLICE)
        return tuple(merged[dim] for dim in order if dim in merged)


def default_slice_shape(hardware: Hardware, devices: int) -> tuple[int, ...]:
    """The standard slice of a generation with `devices` JAX devices (chips per torus dimension).

    Raises:
      HardwareError: no standard slice of that generation has that many devices.
    """
    generation = GENERATIONS[hardware.name]
    chips, extra = divmod(devices, hardware.devices_per_chip)
    number = chips * (2 if generation.counts_cores else 1)
    name = f"{hardware.name}-{number}"
    known = [n for n in known_tpu_names() if n.startswith(f"{hardware.name}-")]
    try:
        described = None if extra else parse_tpu_slice(name)  # the listed sizes, and whole cubes between them
    except ShardscopeError:
        described = None
    if described is None:
        sizes = ", ".join(str(parse_tpu_slice(n).num_devices) for n in known)
        cubes = "; or whole 4x4x4 cubes" if generation.torus_3d else ""
        raise HardwareError(
            f"{devices} devices are not a standard {hardware.name} slice (device counts: {sizes}{cubes}); "
            f"change the mesh or the hardware"
        )
    return tuple(int(d) for d in described.topology_name.split(":")[1].split("x"))


def _physical_dims(hardware: Hardware, shape: tuple[int, ...]) -> list[Span]:
    """Assignable dimensions in the order placement tries them (the chip's own link first)."""
    wraps = hardware.wraps(shape)
    dims = [Span(CORE, hardware.devices_per_chip, 1, hardware.devices_per_chip, False)]
    dims += [Span(TORUS[i], length, 1, length, wraps[i]) for i, length in enumerate(shape)]
    return [span for span in dims if span.extent > 1]


def _place(size: int, free: list[Span]) -> tuple[tuple[Span, ...], list[Span]]:
    """Spans for one mesh axis of `size`, and what stays free: whole dimensions first, then splits."""
    if size == 1:
        return (), free
    for count in range(len(free), 0, -1):
        for chosen in itertools.combinations(range(len(free)), count):
            if math.prod(free[i].extent for i in chosen) == size:
                return tuple(free[i] for i in chosen), [s for i, s in enumerate(free) if i not in chosen]
    spans: list[Span] = []
    rest: list[Span] = []
    left = size
    for span in free:
        factor = math.gcd(left, span.extent)
        if factor > 1:
            # The inner (contiguous) factor goes to this axis; the outer one stays free with a longer stride.
            spans.append(Span(span.dim, factor, span.stride, span.length, span.wrap))
            left //= factor
            if span.extent > factor:
                rest.append(Span(span.dim, span.extent // factor, span.stride * factor, span.length, span.wrap))
        else:
            rest.append(span)
    if left != 1:
        raise MeshError(f"a mesh axis of size {size} does not fit the free physical dimensions")
    return tuple(spans), rest


def layout_for(
    hardware: Hardware | str,
    mesh: Mapping[str, int] | Sequence[tuple[str, int]],
    slices: int = 1,
    slice_shape: tuple[int, ...] | None = None,
    dcn_axis: str = DCN_AXIS,
) -> Layout:
    """The layout of a mesh on a generation's standard slice of the same size (no devices needed).

    Args:
      hardware: a `Hardware` record or a generation name.
      mesh: ordered (axis, size) pairs, as a plan's `case.mesh`.
      slices: slices joined over DCN; `dcn_axis` spans them.
      slice_shape: chips per torus dimension of one slice; default: the standard slice for the mesh.

    Raises:
      HardwareError / MeshError: no standard slice of that size, a mesh larger (or smaller) than the
        slice, or a multi-slice mesh whose `dcn_axis` does not divide among the slices.
    """
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    pairs = list(mesh.items()) if isinstance(mesh, Mapping) else [(str(a), int(s)) for a, s in mesh]
    devices = math.prod(size for _, size in pairs)
    sizes = dict(pairs)
    if slices < 1 or devices % slices:
        raise MeshError(f"mesh {format_mesh(pairs)} ({devices} devices) does not divide among {slices} slices")
    check_spans_slices(sizes, slices, dcn_axis)
    per_slice = devices // slices
    shape = default_slice_shape(hw, per_slice) if slice_shape is None else tuple(slice_shape)
    capacity = math.prod(shape) * hw.devices_per_chip
    if per_slice != capacity:
        relation = "larger" if per_slice > capacity else "smaller"
        raise MeshError(
            f"mesh {format_mesh(pairs)} needs {per_slice} devices per slice, {relation} than the "
            f"{'x'.join(map(str, shape))} {hw.name} slice ({capacity} devices); change --mesh or the topology"
        )
    free = _physical_dims(hw, shape)
    placed: dict[str, tuple[Span, ...]] = {}
    for axis, size in reversed(pairs):
        inner = size // slices if (axis == dcn_axis and slices > 1) else size
        spans, free = _place(inner, free)
        if axis == dcn_axis and slices > 1:
            spans = (*spans, Span(SLICE, slices, 1, slices, False))
        placed[axis] = spans
    axes = tuple(AxisLayout(axis, size, placed[axis]) for axis, size in pairs)
    return Layout(hw.name, shape, slices, hw.devices_per_chip, axes, source="standard slice")


def _hardware_of(devices: Sequence[Any], hardware: Hardware | str | None) -> Hardware:
    if hardware is not None:
        return load_hardware(hardware) if isinstance(hardware, str) else hardware
    kind = str(getattr(devices[0], "device_kind", ""))
    if kind not in DEVICE_KINDS:
        raise HardwareError(f"device kind {kind!r} is not in the hardware table; pass hardware= explicitly")
    return load_hardware(DEVICE_KINDS[kind])


def layout_from_mesh(mesh: Any, hardware: Hardware | str | None = None) -> Layout:
    """The layout of a jax Mesh of TPU devices, read from the devices' coordinates.

    Along each mesh axis (the line through the mesh's first device), every physical coordinate that
    changes gives a span: how many distinct values, their spacing, the dimension's length. Devices do not
    say whether the slice has wraparound links; the generation's published rule (`Hardware.wraps`) does.

    Args:
      mesh: a `jax.sharding.Mesh` whose devices are TPU devices (real or from a topology description).
      hardware: the generation; default: from the devices' `device_kind`.

    Raises:
      HardwareError: a device kind the table lacks (and no `hardware` given), or devices without coords.
    """
    import numpy as np  # lazy: numpy loads on first use

    grid = np.asarray(mesh.devices)
    flat = list(grid.flat)
    if not all(hasattr(d, "coords") for d in flat):
        raise HardwareError("layout_from_mesh needs TPU devices (with coords); price a CPU plan with layout_for")
    hw = _hardware_of(flat, hardware)
    shape = tuple(max(int(d.coords[i]) for d in flat) + 1 for i in range(len(flat[0].coords)))
    shape = shape[: hw.torus_dims] if all(s == 1 for s in shape[hw.torus_dims :]) else shape
    wraps = hw.wraps(shape)
    slice_ids = sorted({int(getattr(d, "slice_index", 0) or 0) for d in flat})

    def position(device: Any) -> dict[str, int]:
        pos = {TORUS[i]: int(c) for i, c in enumerate(device.coords[: len(shape)])}
        pos[CORE] = int(getattr(device, "core_on_chip", 0) or 0)
        pos[SLICE] = slice_ids.index(int(getattr(device, "slice_index", 0) or 0))
        return pos

    lengths = {TORUS[i]: length for i, length in enumerate(shape)}
    lengths[CORE] = hw.devices_per_chip
    lengths[SLICE] = len(slice_ids)
    wrap_of = {TORUS[i]: wraps[i] for i in range(len(shape))}
    axes = []
    for index, name in enumerate(mesh.axis_names):
        line = [grid[(0,) * index + (k,) + (0,) * (grid.ndim - index - 1)] for k in range(grid.shape[index])]
        positions = [position(d) for d in line]
        spans = []
        for dim in (CORE, *TORUS[: len(shape)], SLICE):
            values = sorted({p[dim] for p in positions})
            if len(values) > 1:
                stride = min(b - a for a, b in itertools.pairwise(values))
                spans.append(Span(dim, len(values), stride, lengths[dim], wrap_of.get(dim, False)))
        axes.append(AxisLayout(str(name), int(grid.shape[index]), tuple(spans)))
    return Layout(hw.name, shape, len(slice_ids), hw.devices_per_chip, tuple(axes), source="devices")
