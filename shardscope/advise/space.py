"""The search space of `advise`: every way to factor the devices over the mesh axes a preset uses.

A preset names many mesh axes (MaxText's default has twelve), but on a given model only some of them can
shard anything: an axis that no rule maps a logical axis of the model onto would only make its devices
repeat each other's work. Those axes stay 1; the others (the *live* axes) take every factorization of the
device count, in the preset's axis order (which is also the order devices are laid out in).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from shardscope.case.presets import Preset
from shardscope.case.topology import format_mesh, mesh_label

# A mesh in the preset's axis order: ((axis, size), …), every axis of the preset present.
Mesh = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Candidate:
    """One point of the search: a preset and a mesh.

    `index` is the candidate's place in enumeration order; it breaks ties, so that a ranking never depends
    on the order in which compiles finish.
    """

    index: int
    preset: str  # as the user named it (a built-in name or a path)
    preset_label: str  # what tables show: the built-in name, or the file's stem
    mesh: Mesh

    @property
    def mesh_text(self) -> str:
        """The whole mesh as `--mesh` spells it."""
        return format_mesh(self.mesh)

    @property
    def mesh_label(self) -> str:
        """The axes that split devices, for readers ("fsdp=4,expert=2 (+2 axes of size 1)")."""
        return mesh_label(self.mesh)

    @property
    def key(self) -> str:
        """A unique, stable name: preset label and the axes that split devices."""
        shown = ",".join(f"{axis}={size}" for axis, size in self.mesh if size != 1) or "one-device"
        return f"{self.preset_label}:{shown}"


def live_axes(preset: Preset, logical_names: Iterable[str]) -> tuple[str, ...]:
    """The preset's mesh axes that can shard some tensor of a model whose tensors use `logical_names`.

    An axis is live when a rule maps one of those names onto it, or when it carries the preset's pipeline
    stages. Order: the preset's `mesh_axes`.
    """
    used = set(logical_names)
    live = {axis for logical, axes in preset.logical_axis_rules if logical in used for axis in axes}
    if preset.pipeline is not None:
        live.add(preset.pipeline.stage_axis)
    return tuple(axis for axis in preset.mesh_axes if axis in live)


def divisors(n: int) -> tuple[int, ...]:
    """The divisors of n, ascending."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def factorizations(devices: int, axes: Sequence[str]) -> Iterator[tuple[int, ...]]:
    """Every tuple of sizes, one per axis, whose product is `devices`, in lexicographic order."""
    if not axes:
        if devices == 1:
            yield ()
        return
    for size in divisors(devices):
        for rest in factorizations(devices // size, axes[1:]):
            yield (size, *rest)


def count_factorizations(devices: int, axes: int) -> int:
    """How many tuples `factorizations` yields, without listing them."""
    if axes == 0:
        return 1 if devices == 1 else 0
    return sum(count_factorizations(devices // d, axes - 1) for d in divisors(devices))


def preset_meshes(preset: Preset, live: Sequence[str], devices: int, pinned: Mapping[str, int]) -> Iterator[Mesh]:
    """Every mesh of `devices` over the live axes, with `pinned` axes held at their sizes and the rest at 1."""
    free = [axis for axis in live if axis not in pinned]
    fixed = 1
    for axis, size in pinned.items():
        if axis in preset.mesh_axes:
            fixed *= size
    if devices % fixed:
        return
    for sizes in factorizations(devices // fixed, free):
        chosen = dict(zip(free, sizes, strict=True))
        yield tuple((axis, pinned.get(axis, chosen.get(axis, 1))) for axis in preset.mesh_axes)
