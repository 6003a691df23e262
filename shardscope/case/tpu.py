"""TPU topologies by the names TPU users write (`v5p-16`, `v6e-8`, `tpu7x-8`, …), compiled for ahead of
time with libtpu on a host that has no TPU.

Naming follows the product names: for v4, v5p and tpu7x the number counts TensorCores (two per chip),
for v5e and v6e it counts chips. v4/v5p chips run as one "megacore" device; a tpu7x chip is two devices.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import metadata

from shardscope.case.hardware import load_hardware
from shardscope.errors import ShardscopeError

TPU_EXTRA_HINT = "install the TPU extra: pip install 'shardscope[tpu]'"
_NAME = re.compile(r"(v4|v5e|v5p|v6e|tpu7x)-(\d+)")

# Standard slice shapes (chips) of 3D-torus and 2D-torus generations.
# Chips → torus shape of the slice sizes each family sells (3D: v4 to 4096 chips, v5p to 8960, TPU7x to 9216;
# 2D: v5e and v6e to 256 per slice, more through --slices).
_SHAPES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8), 256: (4, 8, 8)}
_SHAPES_3D |= {512: (8, 8, 8), 1024: (8, 8, 16), 2048: (8, 16, 16), 4096: (16, 16, 16), 6144: (16, 16, 24)}
_SHAPES_3D |= {8960: (16, 20, 28), 9216: (16, 24, 24)}
_SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
_CUBE = 64  # chips of one 4x4x4 cube: a 3D slice past one cube is whole cubes


def _cube_shape(chips: int) -> tuple[int, int, int] | None:
    """The torus shape of a 3D slice of whole 4x4x4 cubes that no table entry names (v5p-1536: 12 cubes as
    8x8x12): the cubes arranged as close to a cube as they go, dimensions ascending; None for other counts."""
    if chips < _CUBE or chips % _CUBE:
        return None
    cubes = chips // _CUBE
    best: tuple[int, int, int] | None = None
    for a in range(1, round(cubes ** (1 / 3)) + 2):
        for b in range(a, int(cubes**0.5) + 2):
            if cubes % (a * b) or cubes // (a * b) < b:
                continue
            shape = (a, b, cubes // (a * b))
            if best is None or shape[2] - shape[0] < best[2] - best[0]:
                best = shape
    return None if best is None else (4 * best[0], 4 * best[1], 4 * best[2])


@dataclass(frozen=True)
class TpuGeneration:
    """How a TPU generation is named and laid out."""

    libtpu_prefix: str  # the name libtpu's topology descriptions use
    counts_cores: bool  # product number = TensorCores (2 per chip) rather than chips
    devices_per_chip: int
    chip_config: str
    torus_3d: bool
    max_chips: int  # the largest slice the generation sells


GENERATIONS = {
    "v4": TpuGeneration(
        "v4", counts_cores=True, devices_per_chip=1, chip_config="megacore", torus_3d=True, max_chips=4096
    ),
    "v5p": TpuGeneration(
        "v5", counts_cores=True, devices_per_chip=1, chip_config="megacore", torus_3d=True, max_chips=8960
    ),
    "tpu7x": TpuGeneration(
        "tpu7x", counts_cores=True, devices_per_chip=2, chip_config="default", torus_3d=True, max_chips=9216
    ),
    "v5e": TpuGeneration(
        "v5e", counts_cores=False, devices_per_chip=1, chip_config="default", torus_3d=False, max_chips=256
    ),
    "v6e": TpuGeneration(
        "v6e", counts_cores=False, devices_per_chip=1, chip_config="default", torus_3d=False, max_chips=256
    ),
}


@dataclass(frozen=True)
class TpuSlice:
    """One TPU slice: the arguments libtpu needs to describe it, and its device count."""

    name: str
    topology_name: str  # e.g. "v5:2x2x2"
    chip_config: str
    chips_per_host_bounds: tuple[int, int, int]
    wrap: tuple[bool, bool, bool]
    num_devices: int


def is_tpu_name(name: str) -> bool:
    """Whether a topology name has the shape of a TPU product name."""
    return _NAME.fullmatch(name) is not None


def known_tpu_names() -> list[str]:
    """Every TPU topology name shardscope can describe."""
    names = []
    for product, generation in GENERATIONS.items():
        shapes = _SHAPES_3D if generation.torus_3d else _SHAPES_2D
        scale = 2 if generation.counts_cores else 1
        names += [f"{product}-{chips * scale}" for chips in shapes if chips <= generation.max_chips]
    return names


def parse_tpu_slice(name: str) -> TpuSlice:
    """`v5p-16` → its libtpu description (8 chips as 2x2x2, megacore: 8 devices).

    Raises:
      ShardscopeError: a TPU generation with a size that is not a standard slice.
    """
    match = _NAME.fullmatch(name)
    if match is None:
        raise ShardscopeError(f"{name!r} is not a TPU topology name (e.g. v5p-16, v6e-8, tpu7x-8)")
    product, number = match.group(1), int(match.group(2))
    generation = GENERATIONS[product]
    chips = number // 2 if generation.counts_cores else number
    shapes = _SHAPES_3D if generation.torus_3d else _SHAPES_2D
    shape = shapes.get(chips) or (_cube_shape(chips) if generation.torus_3d else None)
    if (generation.counts_cores and number % 2) or shape is None or chips > generation.max_chips:
        sizes = ", ".join(n for n in known_tpu_names() if n.startswith(f"{product}-"))
        cubes = f"; or whole 4x4x4 cubes ({_CUBE} chips each)" if generation.torus_3d else ""
        raise ShardscopeError(f"topology {name!r}: not a standard {product} slice (known: {sizes}{cubes})")
    # Which dimensions close their rings with wraparound links is the generation's published rule (whole
    # 4x4x4 cubes on v4/v5p/TPU7x, dimensions of 16 on v5e/v6e), kept with its sources in the hardware table.
    wrap = (*load_hardware(product).wraps(tuple(shape)), False, False)[:3]
    host = (1, 1, 1) if chips == 1 else ((2, 4, 1) if chips == 8 and not generation.torus_3d else (2, 2, 1))
    return TpuSlice(
        name=name,
        topology_name=f"{generation.libtpu_prefix}:{'x'.join(map(str, shape))}",
        chip_config=generation.chip_config,
        chips_per_host_bounds=host,
        wrap=(wrap[0], wrap[1], wrap[2]),
        num_devices=chips * generation.devices_per_chip,
    )


@functools.cache
def libtpu_version() -> str | None:
    """The installed libtpu's version, or None without the TPU extra (read once: a process's installed
    packages do not change, and a search asks once per candidate)."""

    try:
        return metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return None
