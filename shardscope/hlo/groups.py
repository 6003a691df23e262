"""Replica groups of XLA collectives, in every spelling HLO text uses, mapped onto a user's mesh axes.

HLO names the devices of a collective by id. In SPMD programs (one replica, N partitions) the id is the
partition id, which is the position of the device in `mesh.devices.flat`, i.e. row-major over the mesh
shape. The same module can spell its groups three ways, so everything is first expanded to explicit lists:

  explicit   {{0,1},{2,3}}                   ({} means one group holding every device)
  iota       [4,2]<=[2,4]T(1,0)              reshape iota(8) to [2,4], transpose, flatten, cut into 4 groups of 2
  mesh axes  mesh['axis_0'=4,'axis_1'=2] {'axis_0'}  (also @mesh<a=4,b=2>, an optional device order
             `device_ids=([2,4]T(1,0))` or `(0,4,1,5,...)`, and sub-axes 'a':(1)2); the axis names are the
             compiler's own, so they never name the user's axes and only serve to build the device groups.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_IOTA_RE = re.compile(r"^\s*\[([\d,\s]+)\]\s*<=\s*\[([\d,\s]+)\]\s*(?:T\(([\d,\s]+)\))?\s*$")
_MESH_RE = re.compile(
    r"@?mesh\s*[\[<](?P<axes>[^\]>]*)[\]>]\s*,?\s*(?:device_ids\s*=\s*)?"
    r"(?:\((?P<devices>[^()]*(?:\([^()]*\))?[^()]*)\))?\s*\{(?P<grouped>[^{}]*)\}"
)
_MESH_AXIS_RE = re.compile(r"'?([^'=,\s]+)'?\s*=\s*(\d+)")
_AXIS_REF_RE = re.compile(r"(?:'([^']*)'|([^',:\s]+))\s*(?::\s*\((\d+)\)\s*(\d+))?")
_DEVICE_ORDER_RE = re.compile(r"^\[([\d,\s]+)\]\s*(?:T\(([\d,\s]+)\))?$")
_INNER_GROUP_RE = re.compile(r"\{([^{}]*)\}")
_EXPLICIT_RE = re.compile(r"\{(?:\s*\{[\d,\s]*\}\s*,?)*\s*\}")


@dataclass(frozen=True)
class MeshLayout:
    """The user's device mesh: axis names and sizes in mesh order.

    Device id `d` in replica groups is the position in `mesh.devices.flat`, i.e. row-major over `axis_sizes`.

    Attributes:
      axis_names: mesh axes in mesh order, e.g. ("data", "stage", "fsdp", "expert").
      axis_sizes: size of each axis, e.g. (1, 1, 4, 2).
    """

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.axis_names) != len(self.axis_sizes) or any(s < 1 for s in self.axis_sizes):
            raise ValueError(f"mesh layout needs one positive size per axis, got {self.axis_names} {self.axis_sizes}")

    @property
    def num_devices(self) -> int:
        """Number of devices in the mesh."""
        return math.prod(self.axis_sizes)

    def coords(self, device: int) -> tuple[int, ...]:
        """Mesh coordinates of a device id (row-major)."""
        out = []
        for size in reversed(self.axis_sizes):
            device, c = divmod(device, size)
            out.append(c)
        return tuple(reversed(out))


def _ints(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"-?\d+", text)]


def _iota(reshape_dims: list[int], perm: list[int] | None) -> list[int]:
    """Flattened `iota(prod(dims)).reshape(dims).transpose(perm)`, without numpy."""
    perm = list(range(len(reshape_dims))) if perm is None else perm
    if sorted(perm) != list(range(len(reshape_dims))):
        raise ValueError(f"bad transpose {perm} for dims {reshape_dims}")
    strides = [math.prod(reshape_dims[i + 1 :]) for i in range(len(reshape_dims))]
    values = [0]
    for axis in perm:  # row-major over the transposed dims: earlier dims vary slowest
        values = [v + k * strides[axis] for v in values for k in range(reshape_dims[axis])]
    return values


def expand_iota_groups(spec: str) -> list[list[int]]:
    """Expands an iota replica-group spelling into explicit groups.

    Args:
      spec: e.g. "[4,2]<=[2,4]T(1,0)" or "[2,4]<=[8]" — [groups, group size] <= reshape dims, optional transpose.

    Returns:
      The groups, each a list of device ids in order.

    Raises:
      ValueError: if the spelling is malformed or the sizes disagree.
    """
    m = _IOTA_RE.match(spec)
    if not m:
        raise ValueError(f"not an iota replica-group spelling: {spec!r}")
    shape, dims = _ints(m.group(1)), _ints(m.group(2))
    values = _iota(dims, _ints(m.group(3)) if m.group(3) else None)
    if math.prod(shape) != len(values) or not shape:
        raise ValueError(f"iota groups {shape} do not hold {len(values)} devices: {spec!r}")
    size = shape[-1]
    return [values[i : i + size] for i in range(0, len(values), size)] if size else []


def _device_order(text: str | None, count: int) -> list[int]:
    """Device ids of a mesh in mesh order: iota when absent, else an iota spelling or an explicit list."""
    if not text or not text.strip():
        return list(range(count))
    m = _DEVICE_ORDER_RE.match(text.strip())
    if m and (m.group(2) or math.prod(_ints(m.group(1))) == count):
        return _iota(_ints(m.group(1)), _ints(m.group(2)) if m.group(2) else None)
    return _ints(text)


def expand_mesh_groups(spec: str) -> list[list[int]]:
    """Expands a mesh-axes replica-group spelling, e.g. "mesh['a'=4,'b'=2], device_ids=([2,4]T(1,0)) {'a'}".

    The grouped (sub-)axes vary within a group; every other mesh position picks a different group.

    Raises:
      ValueError: if the spelling is malformed.
    """
    m = _MESH_RE.search(spec)
    if not m:
        raise ValueError(f"not a mesh-axes replica-group spelling: {spec!r}")
    axes = [(name, int(size)) for name, size in _MESH_AXIS_RE.findall(m.group("axes"))]
    index = {name: i for i, (name, _) in enumerate(axes)}
    devices = _device_order(m.group("devices"), math.prod(s for _, s in axes))
    refs: dict[int, list[tuple[int, int] | None]] = {}
    for quoted, bare, pre, size in _AXIS_REF_RE.findall(m.group("grouped")):
        name = quoted or bare
        if name not in index:
            raise ValueError(f"grouped axis {name!r} is not in the mesh: {spec!r}")
        refs.setdefault(index[name], []).append((int(pre), int(size)) if pre else None)
    # Cut every mesh axis into pieces so each grouped (sub-)axis is a whole piece, major to minor.
    pieces: list[tuple[int, bool]] = []
    for i, (_, full) in enumerate(axes):
        subs = refs.get(i, [])
        if not subs or None in subs:
            pieces.append((full, bool(subs)))
            continue
        prefix = 1
        for pre, size in sorted(s for s in subs if s is not None):
            if pre > prefix:
                pieces.append((pre // prefix, False))
            pieces.append((size, True))
            prefix = pre * size
        if prefix < full:
            pieces.append((full // prefix, False))
    if math.prod(p for p, _ in pieces) != len(devices):
        raise ValueError(f"mesh of {len(devices)} devices does not match its axes: {spec!r}")
    groups: dict[tuple[int, ...], list[int]] = {}
    for position, device in enumerate(devices):
        key = []
        for size, grouped in reversed(pieces):
            position, c = divmod(position, size)
            if not grouped:
                key.append(c)
        groups.setdefault(tuple(reversed(key)), []).append(device)
    return [groups[k] for k in sorted(groups)]


def parse_replica_groups(spec: str) -> list[list[int]]:
    """Expands any replica-group spelling to explicit groups; [] means one group of every device.

    Raises:
      ValueError: if the spelling is not recognised.
    """
    text = spec.strip()
    if _EXPLICIT_RE.fullmatch(text):
        return [_ints(g) for g in _INNER_GROUP_RE.findall(text[1:-1])]
    if text.startswith("["):
        return expand_iota_groups(text)
    if "mesh" in text:
        return expand_mesh_groups(text)
    raise ValueError(f"unrecognised replica groups {spec!r}")


def format_groups(groups: list[list[int]]) -> str:
    """Canonical compact spelling: members sorted, groups sorted, e.g. "{{0,1},{2,3}}"."""
    inner = sorted(sorted(g) for g in groups)
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in inner) + "}"


def format_pairs(pairs: list[tuple[int, int]]) -> str:
    """Canonical spelling of collective-permute pairs, sorted, e.g. "{0->1,1->2}"."""
    return "{" + ",".join(f"{s}->{t}" for s, t in sorted(pairs)) + "}"


def _partition(mesh: MeshLayout, axes: list[int]) -> set[frozenset[int]]:
    """Device groups induced by varying exactly `axes` (indices) and fixing every other axis."""
    groups: dict[tuple[int, ...], set[int]] = {}
    for d in range(mesh.num_devices):
        c = mesh.coords(d)
        groups.setdefault(tuple(x for i, x in enumerate(c) if i not in axes), set()).add(d)
    return {frozenset(g) for g in groups.values()}


def groups_to_axes(groups: list[list[int]], mesh: MeshLayout) -> tuple[str, ...] | None:
    """The mesh axes whose variation induces exactly these device groups.

    A group set that matches some subset of axes matches it with size-1 axes dropped too, so the subset
    returned is the smallest one: the axes that actually vary inside a group, in mesh order.

    Args:
      groups: device-id groups; [] means one group holding every device.
      mesh: the user's mesh.

    Returns:
      The axes in mesh order; () when every group is a single device (no communication); None when the
      groups are not the partition induced by any subset of axes (or name devices outside the mesh).
    """
    n = mesh.num_devices
    groups = groups or [list(range(n))]
    flat = [d for g in groups for d in g]
    if any(d < 0 or d >= n for d in flat):
        return None
    if all(len(g) <= 1 for g in groups):
        return ()
    varying: set[int] = set()
    for g in groups:
        first = mesh.coords(g[0])
        for d in g[1:]:
            varying.update(i for i, (a, b) in enumerate(zip(first, mesh.coords(d), strict=True)) if a != b)
    axes = sorted(varying)
    if len(flat) != n or len(set(flat)) != n or {frozenset(g) for g in groups} != _partition(mesh, axes):
        return None
    return tuple(mesh.axis_names[i] for i in axes)


def pairs_to_shift(pairs: list[tuple[int, int]], mesh: MeshLayout) -> tuple[tuple[str, ...], int] | None:
    """The mesh axes a collective-permute shifts along, and by how much.

    Every pair must change only that axis's coordinate, all by the same amount modulo its size (pairs need
    not cover the whole ring: a non-wrapping shift still counts). A shift that carries from one axis into
    the next (`0->1, 1->2, …, 7->0` on fsdp=4, expert=2: one ring through every device, as the TPU compiler
    makes for a decomposed all-gather) is a shift along the run of adjacent axes it spans, counted on their
    row-major index.

    Returns:
      (axes, shift) with shift normalised into (-size/2, size/2], positive towards higher coordinates;
      ((), 0) when no pair moves data; None when the pairs are no such shift.
    """
    n = mesh.num_devices
    if any(not (0 <= d < n) for pair in pairs for d in pair):
        return None
    moved = [(mesh.coords(s), mesh.coords(t)) for s, t in pairs if s != t]
    if not moved:
        return (), 0
    if len(moved) != len(pairs):
        return None
    axes = {i for cs, ct in moved for i, (a, b) in enumerate(zip(cs, ct, strict=True)) if a != b}
    run = range(min(axes), max(axes) + 1)
    size = 1
    for i in run:
        size *= mesh.axis_sizes[i]

    def index(coords: tuple[int, ...]) -> int:
        out = 0
        for i in run:
            out = out * mesh.axis_sizes[i] + coords[i]
        return out

    outside = [i for i in range(len(mesh.axis_sizes)) if i not in run]
    if any(cs[i] != ct[i] for cs, ct in moved for i in outside):
        return None
    shifts = {(index(ct) - index(cs)) % size for cs, ct in moved}
    if len(shifts) != 1:
        return None
    shift = shifts.pop()
    spanned = tuple(mesh.axis_names[i] for i in run if mesh.axis_sizes[i] > 1)
    return spanned, signed_shift(shift, size)


def signed_shift(shift: int, size: int) -> int:
    """A shift around a ring of `size`, normalised into (-size/2, size/2] (positive: towards higher
    coordinates), as collective rows give it."""
    shift %= size
    return shift - size if shift > size // 2 else shift
