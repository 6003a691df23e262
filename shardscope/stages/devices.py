"""Devices to compile for, before and after JAX starts: the fake CPU pool, a quiet libtpu, TPU slices described
by libtpu and GPU clusters described by JAX's CUDA plugin (no TPU or GPU needed), and meshes built on them.

Fake CPU devices must exist before the JAX backend starts, so the CLI sizes one pool up front and every
mesh of a run is built on a prefix of it (device id = position in the pool).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardscope.case.gpu import GPU_EXTRA_HINT, GpuCluster, gpu_plugin_version
from shardscope.case.topology import DCN_AXIS, Topology, check_spans_parts, check_spans_slices, dcn_parts, format_mesh
from shardscope.case.tpu import TPU_EXTRA_HINT, TpuSlice, libtpu_version
from shardscope.errors import MeshError, ShardscopeError
from shardscope.stages.compiler_log import capture_compiler_log

if TYPE_CHECKING:
    import jax


def quiet_libtpu() -> None:
    """Environment that keeps libtpu silent on a host without TPU chips (set before it loads).

    Without these, libtpu looks for host bounds and worker host names and logs an error for each, and it
    writes a log file per process under /tmp/tpu_logs; concurrent processes would also fight over its
    lock file. Its compiler also writes every line at or above its minimum level into files of its own in
    the temporary directory (`tpu_driver.*.log.*`, kept after the process ends): its minimum is the level
    it shows on stderr, so those files hold nothing the user did not ask to see (by default, nothing).
    """
    for key, value in {
        "TPU_HOST_BOUNDS": "1,1,1",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "TPU_LOG_DIR": "disabled",
        "TPU_MIN_LOG_LEVEL": os.environ.get("TPU_STDERR_LOG_LEVEL", "3"),
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        "TPU_SKIP_MDS_QUERY": "1",
    }.items():
        os.environ.setdefault(key, value)


def tpu_devices(tpu: TpuSlice, slices: int = 1) -> Any:
    """libtpu's topology description of `slices` copies of a slice (`.devices` are what meshes use).

    Raises:
      ShardscopeError: libtpu is not installed.
    """
    if libtpu_version() is None:
        raise ShardscopeError(f"topology {tpu.name!r} needs libtpu to compile for TPU: {TPU_EXTRA_HINT}")
    quiet_libtpu()
    from jax.experimental import topologies  # lazy: after libtpu's environment is set

    return topologies.get_topology_desc(
        platform="tpu",
        topology_name=tpu.topology_name,
        chip_config_name=tpu.chip_config,
        chips_per_host_bounds=tpu.chips_per_host_bounds,
        num_slices=slices,
        wrap=tpu.wrap,
    )


def gpu_devices(gpu: GpuCluster) -> Any:
    """The CUDA plugin's description of a GPU cluster (`.devices`: every GPU, host by host), for compiling
    ahead of time under the CPU platform: no GPU, driver or CUDA runtime is needed, only the plugin and
    `ptxas` (the GPU extra brings both; the plugin finds `ptxas` in the installed `nvidia-cuda-nvcc-cu12`).

    Raises:
      ShardscopeError: the GPU extra is not installed.
    """
    if gpu_plugin_version() is None:
        raise ShardscopeError(f"topology {gpu.name!r} needs JAX's CUDA plugin to compile for GPUs: {GPU_EXTRA_HINT}")
    return _gpu_topology(gpu)


@functools.cache
def _gpu_topology(gpu: GpuCluster) -> Any:
    # One description per cluster and process: a mesh's devices must be the very objects the compile sees.
    from jax.experimental import topologies  # lazy: JAX loads only where a case is planned

    # The plugin logs that it found no CUDA driver (none is needed): shown only at the level the user asked.
    with capture_compiler_log():
        return topologies.get_topology_desc(platform="cuda", target_config=gpu.target_config(), topology=gpu.topology)


def configure_devices(topology: Topology) -> None:
    """Prepares JAX for a topology before its backend starts (a CPU pool, or a quiet libtpu)."""
    if topology.gpu is not None:
        configure_cpu_devices(1)
        import jax  # lazy: JAX starts only once the pool is sized

        # Starting the backend loads JAX's CUDA plugin, which logs that it found no CUDA driver (none is
        # needed): shown only at the level the user asked for.
        with capture_compiler_log():
            jax.devices()
    elif topology.tpu is not None:
        quiet_libtpu()
        configure_cpu_devices(1)
    else:
        configure_cpu_devices(topology.num_devices)


def configure_cpu_devices(count: int) -> None:
    """Sizes the fake CPU device pool before JAX's backend starts.

    If the backend already runs (tests, a long-lived process), its pool is kept: meshes are built on a
    prefix of it, and `build_mesh` says so if it is too small.
    """
    import jax  # lazy: JAX starts only once the pool is sized
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", count)


def build_mesh(
    topology: Topology, mesh: Sequence[tuple[str, int]], explicit: bool, dcn_axis: str = DCN_AXIS
) -> jax.sharding.Mesh:
    """A Mesh over the first devices of the pool (or the TPU slice), with deliberate axis types; over several
    slices, `dcn_axis` spans them."""
    import jax  # lazy: JAX starts only once the pool is sized
    import numpy as np

    axis_type = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    names = tuple(axis for axis, _ in mesh)
    if topology.gpu is not None:
        check_spans_parts(dict(mesh), dcn_parts(dcn_axis, topology.slices))
        grid = gpu_grid(topology.gpu, mesh, gpu_devices(topology.gpu).devices, dcn_axis)
        return jax.sharding.Mesh(grid, names, axis_types=(axis_type,) * len(mesh))
    if topology.tpu is not None:
        from jax.experimental import mesh_utils  # lazy: JAX loads only where a case is planned

        # Devices are ordered along the torus so that neighbouring mesh coordinates share links; a mesh
        # axis that no set of whole physical axes matches (expert=8 on a 4x4x4 slice) splits one.
        shape = [size for _, size in mesh]
        devices = tpu_devices(topology.tpu, topology.slices).devices
        if topology.slices == 1:
            grid = mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True)
        else:
            grid = _multi_slice_grid(topology, mesh, devices, dcn_axis)
        return jax.sharding.Mesh(grid, names, axis_types=(axis_type,) * len(mesh))
    devices = sorted(jax.devices(), key=lambda d: d.id)
    needed = math.prod(size for _, size in mesh)
    if needed > len(devices):
        raise MeshError(
            f"mesh {format_mesh(mesh)} needs {needed} devices but this process has {len(devices)}; "
            f"the device pool is sized once per process (topology {topology.name})"
        )
    grid = np.array(devices[:needed], dtype=object).reshape([size for _, size in mesh])
    return jax.sharding.Mesh(grid, names, axis_types=(axis_type,) * len(mesh))


def _multi_slice_grid(topology: Topology, mesh: Sequence[tuple[str, int]], devices, dcn_axis: str):
    """Devices for a mesh over several slices: `dcn_axis` spans slices, every other axis stays inside one."""
    from jax.experimental import mesh_utils  # lazy: JAX loads only where a case is planned

    check_spans_slices(dict(mesh), topology.slices, dcn_axis)
    within = [size // topology.slices if axis == dcn_axis else size for axis, size in mesh]
    across = [topology.slices if axis == dcn_axis else 1 for axis, _ in mesh]
    return mesh_utils.create_hybrid_device_mesh(within, across, devices=devices, allow_split_physical_axes=True)


def gpu_grid(gpu: GpuCluster, mesh: Sequence[tuple[str, int]], devices: Sequence[Any], dcn_axis: str) -> Any:
    """A GPU cluster's devices laid out for a mesh: NVLink domain first, then across domains.

    As `mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape, devices)` lays a multi-host GPU mesh (and
    MaxText its `ici_*` and `dcn_*` parallelism): each mesh axis is an in-domain part × a cross-domain part.
    The in-domain parts fill one NVLink domain, whose GPUs take them in order (NVSwitch joins every pair of a
    domain's GPUs alike, so their order there is free); the cross-domain parts are those `dcn_axis` names
    (`fsdp`: all the domains; `data:2,fsdp:16`: a 2 × 16 grid of domains, numbered in mesh order), each the
    outer (slowest) part of its axis.
    """
    import numpy as np  # lazy: off the --help path

    spans = dict(dcn_parts(dcn_axis, gpu.domains))
    ordered = sorted(devices, key=lambda d: d.id)
    across = [spans.get(axis, 1) for axis, _ in mesh]
    within = [size // part for (_, size), part in zip(mesh, across, strict=True)]
    # [domain coordinates..., in-domain coordinates...] → interleaved per axis → the mesh's shape.
    blocks = np.array(ordered, dtype=object).reshape(across + within)
    rank = len(mesh)
    order = [i for axis in range(rank) for i in (axis, rank + axis)]
    return blocks.transpose(order).reshape([size for _, size in mesh])


def domain_grid(gpu: GpuCluster, device_ids: Any) -> Any:
    """Each mesh position's NVLink domain (the devices' ids are positions in the cluster, host by host)."""
    import numpy as np  # lazy: off the --help path

    return np.asarray(device_ids) // gpu.domain_gpus
