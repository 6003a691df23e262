"""MaxText's own step on a GPU cluster (`maxtext:MODEL --topology h100-2x8`): its mesh laid by MaxText's own
code on the CUDA plugin's description of the cluster, and its compile's options and refusals.

MaxText lays a multi-host GPU mesh with `create_device_mesh`: its `ici_*` parallelism inside a slice, its
`dcn_*` across slices (`mesh_utils.create_hybrid_device_mesh`, which groups the devices by `slice_index`). On
a real cluster a slice is an NVLink domain (an HGX host, a GB200 rack); the plugin's deviceless description
numbers every GPU in one partition (`slice_index` 0), so MaxText is handed the same devices with the slice
index their NVLink domain gives them, and its grid is read back as the plugin's devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardscope.case.gpu import GpuCluster
from shardscope.case.maxtext_model import MaxTextCase, MaxTextError
from shardscope.stages.devices import gpu_devices


@dataclass(frozen=True)
class _InDomain:
    """A GPU as MaxText's mesh code reads it: the plugin's device, with its NVLink domain as its slice."""

    device: Any
    slice_index: int

    @property
    def id(self) -> int:
        return int(self.device.id)

    @property
    def platform(self) -> str:
        return "gpu"

    @property
    def device_kind(self) -> str:
        return str(self.device.device_kind)

    @property
    def process_index(self) -> int:
        return int(self.device.process_index)


def gpu_mesh_grid(gpu: GpuCluster, config: Any) -> Any:
    """The device grid MaxText lays for the cluster under its config (`maxtext_utils.create_device_mesh`).

    Raises:
      MaxTextError: MaxText cannot lay its parallelism on the cluster (its message).
    """
    import numpy as np  # lazy: off the --help path
    from maxtext.utils import maxtext_utils  # lazy: MaxText is an optional extra

    devices = sorted(gpu_devices(gpu).devices, key=lambda d: d.id)
    placed = [_InDomain(d, d.id // gpu.domain_gpus) for d in devices]
    try:
        grid = maxtext_utils.create_device_mesh(config, placed)
    except (ValueError, AssertionError) as err:
        raise MaxTextError(f"MaxText cannot lay its mesh on {gpu.name}: {str(err).splitlines()[0]}") from None
    return np.vectorize(lambda d: d.device, otypes=[object])(np.asarray(grid, dtype=object))


def gpu_compile_options(flags: Mapping[str, Any]) -> dict[str, Any]:
    """MaxText's `compile_xla_flags` as options of the GPU compiler, which reads a boolean as True/False only
    (`--xla_gpu_enable_triton_gemm=false`, as MaxText's GPU runs write it in XLA_FLAGS)."""
    bools = {"true": True, "false": False}
    return {key: bools.get(str(value).lower(), value) for key, value in flags.items()}


def gpu_compile_error(case: MaxTextCase, message: str) -> str | None:
    """The one line a GPU compile's refusal becomes, or None for one to raise as it is."""
    where = f"maxtext:{case.model} on {case.topology.name}"
    if "No such compile option" in message:
        return f"{where}: the GPU compiler has no such option ({message}); check --maxtext compile_xla_flags=…"
    if "Couldn't find output tile sizes" in message:
        # XLA's GPU compiler finds no Triton tiling for a matmul (seen on B200): cuBLAS compiles it.
        return (
            f"{where}: the GPU compiler found no Triton tiling for a matmul; compile the matmuls with cuBLAS, as "
            "MaxText's GPU runs do: --maxtext 'compile_xla_flags=--xla_gpu_enable_triton_gemm=false'"
        )
    return None
