"""NVIDIA GPU clusters by name (`h100-2x8`: hosts × GPUs per host; `h200-…`, `b200-…`, `gb200-…`), compiled
for ahead of time by XLA's GPU compiler on a host that has no GPU.

A cluster is NVLink domains joined by the network (InfiniBand or RoCE): on an HGX/DGX host the domain is the
host's 8 GPUs; a GB200 NVL72 rack joins 18 hosts of 4 GPUs into one domain of 72. The compiler sees the
cluster as `<partitions>x<hosts per partition>x<GPUs per host>` and a target description of the GPU (XLA's
`gpu_specs` text protos, shipped in `gpu_specs/` with their sources).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import metadata, resources

from shardscope.case.hardware import HardwareError, hardware_table
from shardscope.errors import ShardscopeError, unknown_name

GPU_EXTRA_HINT = "install the GPU extra: pip install 'shardscope[gpu]'"
_NAME = re.compile(r"(h100|h200|b200|gb200)-(\d+)x(\d+)")
MAX_HOSTS = 4096


@dataclass(frozen=True)
class GpuGeneration:
    """How a GPU product is sold and described to the compiler."""

    target_config: str  # file in gpu_specs/
    gpus_per_host: tuple[int, ...]  # the host sizes sold
    hosts_per_domain: int  # hosts one NVLink domain joins (1: the host is the domain)
    title: str


GENERATIONS = {
    # HGX/DGX H100, H200 and B200 hosts: 8 GPUs on NVSwitch; cloud machine types also sell 1, 2 and 4.
    "h100": GpuGeneration("h100_sxm.txtpb", (1, 2, 4, 8), 1, "NVIDIA H100 SXM 80 GB"),
    "h200": GpuGeneration("h200_sxm.txtpb", (1, 2, 4, 8), 1, "NVIDIA H200 SXM 141 GB"),
    "b200": GpuGeneration("b200.txtpb", (1, 2, 4, 8), 1, "NVIDIA B200 180 GB"),
    # GB200 NVL72: 18 compute trays of 4 Blackwell GPUs (2 Grace-Blackwell superchips) on one NVLink domain.
    "gb200": GpuGeneration("b200.txtpb", (4,), 18, "NVIDIA GB200 NVL72"),
}
_EXAMPLE_HOSTS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class GpuCluster:
    """One GPU cluster: its generation, hosts and NVLink domains, and what the compiler is told."""

    name: str
    generation: str
    hosts: int
    gpus_per_host: int
    hosts_per_domain: int

    @property
    def num_devices(self) -> int:
        """Every GPU of the cluster (one JAX device each)."""
        return self.hosts * self.gpus_per_host

    @property
    def domains(self) -> int:
        """NVLink domains: what crosses between them crosses the network."""
        return self.hosts // self.hosts_per_domain

    @property
    def domain_gpus(self) -> int:
        """GPUs of one NVLink domain."""
        return self.hosts_per_domain * self.gpus_per_host

    @property
    def topology(self) -> str:
        """The compiler's `<partitions>x<hosts per partition>x<GPUs per host>` (one partition: the hosts are
        the processes of one job, as a multi-host run starts them)."""
        return f"1x{self.hosts}x{self.gpus_per_host}"

    def target_config(self) -> str:
        """The GPU's target description (XLA's GpuTargetConfig text proto)."""
        name = GENERATIONS[self.generation].target_config
        return resources.files("shardscope.case").joinpath("gpu_specs", name).read_text(encoding="utf-8")


def is_gpu_name(name: str) -> bool:
    """Whether a topology name has the shape of a GPU cluster name (`h100-2x8`)."""
    return _NAME.fullmatch(name) is not None


def known_gpu_names() -> list[str]:
    """Example GPU cluster names, one per size shown (any number of hosts up to the maximum is accepted)."""
    names = []
    for product, generation in GENERATIONS.items():
        per_host = max(generation.gpus_per_host)
        if generation.hosts_per_domain == 1:
            names += [f"{product}-{hosts}x{per_host}" for hosts in _EXAMPLE_HOSTS]
        else:
            names += [f"{product}-{hosts}x{per_host}" for hosts in (generation.hosts_per_domain, 36, 72)]
    return names


def parse_gpu_cluster(name: str) -> GpuCluster:
    """`h100-2x8` → 2 hosts of 8 H100s, each host its own NVLink domain.

    Raises:
      ShardscopeError: a host size that is not sold, a host count out of range, or (GB200) hosts that do not
        fill whole NVL72 domains.
    """
    match = _NAME.fullmatch(name)
    if match is None:
        raise ShardscopeError(f"{name!r} is not a GPU cluster name: expected GEN-HOSTSxGPUS, e.g. h100-2x8")
    product, hosts, per_host = match.group(1), int(match.group(2)), int(match.group(3))
    generation = GENERATIONS[product]
    if per_host not in generation.gpus_per_host:
        sold = ", ".join(map(str, generation.gpus_per_host))
        raise ShardscopeError(
            f"topology {name!r}: a {product} host has {sold} GPUs, found {per_host}; e.g. {product}-{hosts}x"
            f"{max(generation.gpus_per_host)}"
        )
    if not 1 <= hosts <= MAX_HOSTS:
        raise ShardscopeError(f"topology {name!r}: the number of hosts must be 1..{MAX_HOSTS}, found {hosts}")
    per_domain = generation.hosts_per_domain
    if per_domain > 1 and hosts > per_domain and hosts % per_domain:
        raise ShardscopeError(
            f"topology {name!r}: an NVL72 domain is {per_domain} hosts of {per_host} GPUs; give up to {per_domain} "
            f"hosts or whole domains (e.g. {product}-{per_domain * (hosts // per_domain + 1)}x{per_host})"
        )
    return GpuCluster(name, product, hosts, per_host, min(per_domain, hosts))


def with_gpu_domains(name: str, domains: int) -> str:
    """The cluster `--slices K` stands for: K NVLink domains of the one `name` describes (`h100-1x8`, 2 →
    `h100-2x8`).

    Raises:
      ShardscopeError: `name` is not one whole NVLink domain.
    """
    cluster = parse_gpu_cluster(name)
    if cluster.domains != 1:
        raise ShardscopeError(
            f"--slices {domains}: applies to one NVLink domain (e.g. {cluster.generation}-"
            f"{cluster.hosts_per_domain}x{cluster.gpus_per_host}), not {name!r} ({cluster.domains} domains)"
        )
    return f"{cluster.generation}-{cluster.hosts * domains}x{cluster.gpus_per_host}"


@functools.cache
def gpu_plugin_version() -> str | None:
    """The installed CUDA plugin's version, or None without the GPU extra."""
    try:
        return metadata.version("jax-cuda12-plugin")
    except metadata.PackageNotFoundError:
        return None


GPU_FIGURES = ("peak_bf16_flops", "hbm_bytes", "hbm_bandwidth", "nvlink_bandwidth", "network_bandwidth")
# Figures a GPU may lack: a matmul of two float8 inputs runs at `peak_fp8_flops` where the table gives one, else
# at the bf16 peak (as for TPUs).
OPTIONAL_GPU_FIGURES = ("peak_fp8_flops",)


@dataclass(frozen=True)
class GpuHardware:
    """One GPU's published figures (the hardware table's `gpus`): per GPU, links per direction."""

    name: str
    peak_bf16_flops: float  # dense FLOP/s
    hbm_bytes: int
    hbm_bandwidth: float  # bytes/s
    nvlink_bandwidth: float  # bytes/s each way, to the rest of its NVLink domain
    network_bandwidth: float  # bytes/s each way, through its NIC to other domains
    efficiency: float  # the table's: the fraction of every peak figure reached (uncalibrated on GPUs)
    peak_fp8_flops: float | None = None  # dense FLOP/s of a matmul of two float8 inputs

    def peak_flops(self, precision: str = "") -> float:
        """Dense peak FLOP/s of matmuls of a precision class (`WorkBin.precision`): float8's where the table
        gives it, else bf16's."""
        return self.peak_fp8_flops if precision == "fp8" and self.peak_fp8_flops else self.peak_bf16_flops


def load_gpu_hardware(name: str) -> GpuHardware:
    """The hardware table's figures for a GPU (`h100`, …; a cluster name such as `h100-2x8` is accepted).

    Raises:
      HardwareError: an unknown GPU, or a missing or non-positive figure.
    """
    table = hardware_table()
    gpus = table.get("gpus") or {}
    generation = name.split("-", 1)[0]
    if generation not in gpus:
        raise HardwareError(unknown_name("GPU", generation, gpus).args[0])
    entry = gpus[generation]
    values: dict[str, float] = {}
    for key in GPU_FIGURES:
        value = entry.get(key) if isinstance(entry, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise HardwareError(f"hardware table: gpus.{generation}.{key} must be a positive number, found {value!r}")
        values[key] = float(value)
    for key in OPTIONAL_GPU_FIGURES:
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
            raise HardwareError(f"hardware table: gpus.{generation}.{key} must be a positive number, found {value!r}")
    unknown = sorted(set(entry) - set(GPU_FIGURES) - set(OPTIONAL_GPU_FIGURES))
    if unknown:
        raise HardwareError(f"hardware table: gpus.{generation} has unknown figures {', '.join(unknown)}")
    return GpuHardware(
        name=generation,
        peak_bf16_flops=values["peak_bf16_flops"],
        hbm_bytes=int(values["hbm_bytes"]),
        hbm_bandwidth=values["hbm_bandwidth"],
        nvlink_bandwidth=values["nvlink_bandwidth"],
        network_bandwidth=values["network_bandwidth"],
        efficiency=float(table.get("efficiency", 1.0)),
        peak_fp8_flops=None if entry.get("peak_fp8_flops") is None else float(entry["peak_fp8_flops"]),
    )
