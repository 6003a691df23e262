"""The hardware table: what one TPU chip of each generation can do, read from `hardware.yaml`.

Figures are per chip as vendors publish them; the cost model works per JAX device, so `Hardware` also
answers per device (a TPU7x chip is two devices and shares its FLOPs, HBM and network between them).
Every figure must be present: a table entry missing one is a broken table, not a zero.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from shardscope.errors import ShardscopeError, unknown_name

TABLE = "hardware.yaml"
# The figures every generation must give; `chip_link_bandwidth` only where a chip is several devices.
# Figures an entry may leave out: a chip with one device has no link between its devices; without a host
# bandwidth, offloaded tensors' transfers are not priced.
OPTIONAL_FIGURES = ("chip_link_bandwidth", "host_bandwidth", "peak_fp8_flops", "peak_int8_ops")
FIGURES = (
    "peak_bf16_flops",
    "hbm_bytes",
    "hbm_bandwidth",
    "ici_link_bandwidth",
    "ici_links",
    "torus_dims",
    "wrap_length",
    "wrap_needs_full_cube",
    "dcn_bandwidth",
    "devices_per_chip",
    "ici_hop_latency",
    "dcn_latency",
)


class HardwareError(ShardscopeError):
    """An unknown generation, or a hardware table entry that is missing or mistypes a figure."""


@dataclass(frozen=True)
class Hardware:
    """One TPU generation's published figures (per chip; ICI per link and direction)."""

    name: str
    peak_bf16_flops: float  # FLOP/s per chip
    hbm_bytes: int  # per chip
    hbm_bandwidth: float  # bytes/s per chip
    ici_link_bandwidth: float  # bytes/s, one link, one direction
    ici_links: int  # links per chip (2 per torus dimension)
    torus_dims: int  # 2 or 3
    wrap_length: int  # a torus dimension of a multiple of this length can have wraparound links
    wrap_needs_full_cube: bool  # ... and only if every dimension of the slice is such a multiple
    dcn_bandwidth: float  # bytes/s per chip (egress), between slices
    devices_per_chip: int
    ici_hop_latency: float  # seconds per ICI hop
    dcn_latency: float  # seconds per step of a collective over DCN
    chip_link_bandwidth: float | None = None  # bytes/s one direction between devices of one chip
    host_bandwidth: float | None = None  # bytes/s per chip between HBM and host memory (remat offload)
    # Peak FLOP/s per chip of matmuls whose inputs are 8-bit floats, and OP/s of 8-bit integers (None: not
    # published; such matmuls are then priced at the bfloat16 peak).
    peak_fp8_flops: float | None = None
    peak_int8_ops: float | None = None
    efficiency: float = 1.0  # the table's default fraction of link bandwidth collectives reach
    # Fitted to published step times (the table's `calibration`): the fraction of peak FLOP/s the matrix
    # units reach on a compiled step's matmuls, and of peak bandwidth its HBM traffic reaches.
    mxu_efficiency: float = 1.0
    hbm_efficiency: float = 1.0
    # ... and the fraction the attention kernel's FLOPs reach (None: the matmuls' fraction).
    kernel_efficiency: float | None = None
    # A CPU compile's bytes of ops without matrix work, as the TPU's compile of the same step touches them
    # (fitted to compiles of both; `shardscope.cost.step.bin_seconds`).
    cpu_memory_bytes_factor: float = 1.0
    # ... and of its ops that gather or scatter rows (`gather` bins), whose bytes fusion barely changes.
    cpu_gather_bytes_factor: float = 1.0
    # The grouped-matmul kernel of a dropless MoE (MaxText's megablox/sparse_matmul) reaches the matmuls'
    # fraction × (expert width / grouped_reference_width) ** grouped_width_exponent, at most the matmuls'.
    grouped_reference_width: float | None = None
    grouped_width_exponent: float = 0.0

    def grouped_efficiency(self, width: int) -> float:
        """The fraction of peak FLOP/s the grouped-matmul kernel reaches on experts `width` wide."""
        if self.grouped_reference_width is None or width <= 0:
            return self.mxu_efficiency
        relative = (width / self.grouped_reference_width) ** self.grouped_width_exponent
        return self.mxu_efficiency * min(1.0, relative)

    @property
    def host_bandwidth_per_device(self) -> float | None:
        """The chip's host link shared by its devices."""
        return None if self.host_bandwidth is None else self.host_bandwidth / self.devices_per_chip

    @property
    def flops_per_device(self) -> float:
        """Peak bf16 FLOP/s of one JAX device."""
        return self.peak_bf16_flops / self.devices_per_chip

    def peak_flops_per_device(self, precision: str = "") -> float:
        """Peak FLOP/s of one JAX device for matmuls of a precision class (`WorkBin.precision`)."""
        peak = {"fp8": self.peak_fp8_flops, "int8": self.peak_int8_ops}.get(precision)
        return (peak or self.peak_bf16_flops) / self.devices_per_chip

    @property
    def hbm_bytes_per_device(self) -> int:
        """HBM capacity one JAX device can use."""
        return self.hbm_bytes // self.devices_per_chip

    @property
    def hbm_bandwidth_per_device(self) -> float:
        """HBM bandwidth of one JAX device."""
        return self.hbm_bandwidth / self.devices_per_chip

    @property
    def dcn_bandwidth_per_device(self) -> float:
        """The chip's DCN bandwidth shared by its devices."""
        return self.dcn_bandwidth / self.devices_per_chip

    def wraps(self, shape: tuple[int, ...]) -> tuple[bool, ...]:
        """Which dimensions of a slice of `shape` (chips) have wraparound links.

        v4/v5p/TPU7x: every dimension of a slice made of whole 4x4x4 cubes (optical switches close the
        rings); v5e/v6e: any dimension of length 16, whatever the others.
        """
        multiple = tuple(d >= self.wrap_length and d % self.wrap_length == 0 for d in shape)
        if self.wrap_needs_full_cube and not all(multiple):
            return tuple(False for _ in shape)
        return multiple


# A table of one's own (other figures, a newer generation): its entries replace the built-in ones of the
# same name, and its `efficiency`, if given, the built-in default.
TABLE_ENV = "SHARDSCOPE_HARDWARE_TABLE"


def table_source() -> str:
    """Where the figures come from: the built-in table, with the file SHARDSCOPE_HARDWARE_TABLE names over it."""
    own = os.environ.get(TABLE_ENV)
    return f"shardscope/case/{TABLE}" + (f" with {own} over it" if own else "")


def hardware_table() -> dict[str, Any]:
    """The whole table as read (the built-in one, with SHARDSCOPE_HARDWARE_TABLE's entries over it)."""
    return _table()


def _table() -> dict[str, Any]:
    built_in = _read_table(None)
    path = os.environ.get(TABLE_ENV)
    if not path:
        return built_in
    own = _read_table(path)
    return {
        "efficiency": own.get("efficiency", built_in.get("efficiency")),
        "calibration": {**built_in.get("calibration", {}), **own.get("calibration", {})},
        "generations": {**built_in["generations"], **own["generations"]},
        "gpus": {**built_in.get("gpus", {}), **own.get("gpus", {})},
    }


@functools.cache
def _read_table(path: str | None) -> dict[str, Any]:
    where = path or TABLE
    if path is None:
        text = resources.files("shardscope.case").joinpath(TABLE).read_text(encoding="utf-8")
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise HardwareError(f"hardware table {path} ({TABLE_ENV}) does not exist") from None
        except (OSError, UnicodeDecodeError) as err:
            raise HardwareError(f"cannot read hardware table {path} ({TABLE_ENV}): {err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise HardwareError(f"hardware table {where}: malformed YAML{line}") from None
    if not isinstance(data, dict) or not isinstance(data.get("generations"), dict):
        raise HardwareError(f"hardware table {where}: expected a mapping with 'efficiency' and 'generations'")
    return data


def _where() -> str:
    return f"hardware table {os.environ.get(TABLE_ENV) or TABLE}"  # a broken entry is the user's file's


def known_hardware() -> list[str]:
    """Every generation in the hardware table."""
    return sorted(_table()["generations"])


def hardware_from_dict(name: str, entry: Any, efficiency: Any, calibration: dict[str, Any] | None = None) -> Hardware:
    """Validates one table entry.

    Raises:
      HardwareError: a figure is missing, not a number, or not positive.
    """
    if not isinstance(entry, dict):
        raise HardwareError(f"{_where()}: entry {name!r} must be a mapping of figures")
    needed = list(FIGURES)
    if entry.get("devices_per_chip", 1) != 1:
        needed.append("chip_link_bandwidth")
    missing = [key for key in needed if entry.get(key) is None]
    if missing:
        raise HardwareError(
            f"{_where()}: entry {name!r} is missing {', '.join(missing)}; add the figure with its source"
        )
    unknown = sorted(set(entry) - set(FIGURES) - set(OPTIONAL_FIGURES))
    if unknown:
        raise HardwareError(f"{_where()}: entry {name!r} has unknown figures {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "wrap_needs_full_cube":
            if not isinstance(value, bool):
                raise HardwareError(f"{_where()}: {name}.{key} must be true or false, found {value!r}")
            values[key] = value
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise HardwareError(f"{_where()}: {name}.{key} must be a positive number, found {value!r}")
        integral = key in ("hbm_bytes", "ici_links", "torus_dims", "wrap_length", "devices_per_chip")
        values[key] = int(value) if integral else float(value)
    if isinstance(efficiency, bool) or not isinstance(efficiency, int | float) or not 0 < efficiency <= 1:
        raise HardwareError(f"{_where()}: 'efficiency' must be in (0, 1], found {efficiency!r}")
    given = calibration or {}
    fitted = {key: _fraction(key, given.get(key, 1.0)) for key in CALIBRATED if key != "kernel_efficiency"}
    kernel = given.get("kernel_efficiency")
    grouped = given.get("grouped_matmul") or {}
    return Hardware(
        name=name,
        efficiency=float(efficiency),
        mxu_efficiency=fitted["mxu_efficiency"],
        hbm_efficiency=fitted["hbm_efficiency"],
        cpu_memory_bytes_factor=fitted["cpu_memory_bytes_factor"],
        cpu_gather_bytes_factor=_positive("cpu_gather_bytes_factor", given.get("cpu_gather_bytes_factor")) or 1.0,
        kernel_efficiency=None if kernel is None else _fraction("kernel_efficiency", kernel),
        grouped_reference_width=_positive("grouped_matmul.reference_width", grouped.get("reference_width")),
        grouped_width_exponent=_positive("grouped_matmul.width_exponent", grouped.get("width_exponent")) or 0.0,
        **values,
    )


# The table's `calibration` block: constants fitted to published runs (each a fraction of a peak figure).
CALIBRATED = ("mxu_efficiency", "hbm_efficiency", "kernel_efficiency", "cpu_memory_bytes_factor")


def _positive(key: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise HardwareError(f"{_where()}: calibration.{key} must be a positive number, found {value!r}")
    return float(value)


def _fraction(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise HardwareError(f"{_where()}: calibration.{key} must be in (0, 1], found {value!r}")
    return float(value)


def load_hardware(name: str) -> Hardware:
    """The hardware table's record for a generation (`v5p`, `v6e`, `tpu7x`, ...).

    A TPU topology name is accepted too (`v5p-16` → `v5p`), so a plan's topology prices as itself.

    Raises:
      HardwareError: an unknown generation (with a "did you mean"), or a broken table entry.
    """
    table = _table()
    generation = name.rsplit("-", 1)[0] if name.rsplit("-", 1)[-1].isdigit() else name
    if generation not in table["generations"]:
        raise HardwareError(unknown_name("hardware", name, table["generations"]).args[0])
    return hardware_from_dict(
        generation, table["generations"][generation], table.get("efficiency"), _calibration(table, generation)
    )


def _calibration(table: dict[str, Any], generation: str) -> dict[str, Any]:
    """The fitted constants of a generation: the table's own for it (`calibration.generations.<name>`), else
    the ones fitted to every generation's runs together."""
    calibration = table.get("calibration")
    if calibration is None:
        return {}
    if not isinstance(calibration, dict):
        raise HardwareError(f"{_where()}: 'calibration' must be a mapping of fitted constants")
    own = calibration.get("generations") or {}
    if not isinstance(own, dict) or not all(isinstance(v, dict) for v in own.values()):
        raise HardwareError(f"{_where()}: 'calibration.generations' must map generations to fitted constants")
    unknown = sorted({key for value in own.values() for key in value} - set(CALIBRATED))
    if unknown:
        raise HardwareError(f"{_where()}: calibration.generations has unknown constants {', '.join(unknown)}")
    shared = {key: value for key, value in calibration.items() if key != "generations"}
    if not isinstance(shared.get("grouped_matmul", {}), dict):
        raise HardwareError(f"{_where()}: 'calibration.grouped_matmul' must be a mapping")
    return {**shared, **own.get(generation, {})}
