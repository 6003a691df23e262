"""A rule file that sets no mesh sizes (every MaxText `custom_mesh_and_rule` file): planned on MaxText's
defaults, where FSDP takes every device and the rules over any other axis shard nothing.

Users meet this on the first run of their own file, so `dump` and `lint` say it once, with how to size the
mesh, rather than `lint` listing one `unit-axis-rule` finding per rule. Imports no JAX.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from shardscope.case.presets import Preset
from shardscope.case.topology import resolve_mesh

Mesh = Sequence[tuple[str, int]]
# MaxText sizes an axis with `ici_<axis>_parallelism`, except the pipeline's axis `stage` (as maxtext_run reads them).
_MAXTEXT_KEY_NAME = {"stage": "pipeline"}
_PRESET_SUFFIXES = (".yml", ".yaml")


def on_unsized_defaults(preset: Preset, mesh: Mesh) -> bool:
    """Whether a preset that sets no mesh sizes is planned on the mesh it defaults to (no `--mesh`, no
    `ici_*_parallelism`): the sizes then come from no one's choice."""
    if preset.mesh:
        return False
    devices = math.prod(size for _, size in mesh)
    return tuple(mesh) == resolve_mesh(preset, devices, {})


def idle_rule_axes(preset: Preset, mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes (of `mesh_axes`) the rules name that are size 1 on this mesh, in `mesh_axes` order."""
    sizes = dict(mesh)
    named = {axis for _, axes in preset.logical_axis_rules for axis in axes}
    return tuple(axis for axis in preset.mesh_axes if axis in named and sizes.get(axis, 1) == 1)


def maxtext_key(axis: str) -> str:
    """MaxText's key that sizes a mesh axis within a slice: `ici_expert_parallelism`."""
    return f"ici_{_MAXTEXT_KEY_NAME.get(axis, axis)}_parallelism"


def preset_label(given: str, preset: Preset) -> str:
    """How the note names the rules: the file name the user gave, else the preset's name."""
    path = Path(given)
    return path.name if path.suffix in _PRESET_SUFFIXES else preset.name


def _sizing_hint(preset: Preset, idle: tuple[str, ...], devices: int) -> str:
    """How to size the mesh, shown on the idle axis most rules name (the first in `mesh_axes` of a tie), split
    the fewest ways the devices allow."""
    if devices == 1:
        return "on one device every axis is size 1"
    counts = Counter(axis for _, axes in preset.logical_axis_rules for axis in axes if axis in idle)
    axis = max(idle, key=lambda a: (counts[a], -idle.index(a)))
    ways = next(n for n in range(2, devices + 1) if devices % n == 0)
    return f"size them with --mesh, e.g. --mesh {axis}={ways} (MaxText: {maxtext_key(axis)}={ways})"


def unsized_mesh_note(preset: Preset, mesh: Mesh, label: str) -> str | None:
    """The one line `dump` and `lint` print for a file without mesh sizes planned on the defaults, or None
    (the file or the user sized the mesh, or every axis its rules name is larger than 1)."""
    idle = idle_rule_axes(preset, mesh)
    if not idle or not on_unsized_defaults(preset, mesh):
        return None
    shown = ",".join(f"{axis}={size}" for axis, size in mesh if size > 1) or "one device"
    devices = math.prod(size for _, size in mesh)
    return (
        f"{label} sets no mesh sizes: planned on {shown}; its rules over {', '.join(idle)} shard nothing here — "
        + _sizing_hint(preset, idle, devices)
    )
