"""What MaxText's build sees of its target while its step is built and traced on this host: tokamax's kernels
see the target's device (a TPU chip, a GPU) where they look for the process's default device (this host's
CPU), and tokamax's absl options are their defaults.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from shardscope.case.maxtext_model import MaxTextCase


class _DefaultDeviceAs:
    """`jax.extend.backend` as a module that imports it sees it, but with another default device."""

    def __init__(self, backend: Any, device: Any) -> None:
        self._backend = backend
        self._device = device

    def get_default_device(self) -> Any:
        return self._device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


@contextlib.contextmanager
def _kernels_see_target(device: Any) -> Iterator[None]:
    """While MaxText's step is built and traced for a TPU topology, tokamax and Pallas's TPU info see the target
    TPU chip where they look for the process's default device (this host's CPU); nothing else does.

    tokamax (`use_tokamax_gmm=True`, its `ragged_dot`) picks and checks its kernel by the default device, not
    by the mesh: `Op.__call__` checks `supported_on` of each device of its arguments, which under a trace are
    tracers with none, so it checks `jax.extend.backend.get_default_device()`; its Mosaic TPU kernel says
    `device.platform == "tpu" and pltpu.get_tpu_info().generation >= 5`, and `get_tpu_info` reads the
    abstract mesh's device kind where a mesh is set (the trace of the step) and the default device otherwise
    (the abstract state, shaped without one); its autotuned tile sizes are looked up by the same device kind.
    On this host that device is the CPU: the build raises `Not supported on cpu`, where on the TPU that
    MaxText runs on tokamax's TPU kernel is traced (forward and, in the backward pass, its vjp's kernels).
    `jax.default_device` cannot be set to the target instead: its devices compile only, and MaxText computes
    eagerly while it builds (its example RNG key). So tokamax's modules get a `backend` whose default device is
    the target's, and Pallas's TPU info reads the target's kind and cores where it would read the default
    device; both restored on exit (and the TPU info it cached meanwhile dropped).
    """
    from jax._src.pallas.mosaic import tpu_info  # lazy: JAX starts once the device pool is sized

    def device_kind() -> str:
        return abstract.device_kind if (abstract := _abstract_device()) else str(device.device_kind)

    def num_cores() -> int:
        return int(abstract.num_cores) if (abstract := _abstract_device()) else int(device.num_cores)

    kept = (tpu_info.get_device_kind, tpu_info.get_num_device_cores)
    tpu_info.get_device_kind, tpu_info.get_num_device_cores = device_kind, num_cores
    try:
        with _tokamax_sees(device):
            yield
    finally:
        tpu_info.get_device_kind, tpu_info.get_num_device_cores = kept
        tpu_info.get_tpu_info.cache_clear()


@contextlib.contextmanager
def _tokamax_sees(device: Any) -> Iterator[None]:
    """tokamax's modules see `device` as the process's default device (see `_kernels_see_target`).

    On a GPU cluster the same holds of its GPU kernels: MaxText's `attention=flash` on GPU is tokamax's Pallas
    Triton flash attention, whose `supported_on` asks for a device of compute capability 8.0 or more and is
    handed this host's CPU; the plugin's GPUs carry their compute capability."""
    from jax.extend import backend  # lazy: JAX starts once the device pool is sized

    seen = _DefaultDeviceAs(backend, device)
    tokamax = [m for name, m in list(sys.modules.items()) if name.split(".")[0] == "tokamax" and m is not None]
    patched = [m for m in tokamax if getattr(m, "backend", None) is backend]
    for module in patched:
        module.backend = seen  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in patched:
            module.backend = backend  # type: ignore[attr-defined]


def _abstract_device() -> Any:
    """The device of the abstract mesh set by `jax.set_mesh` (None: no mesh set, or one without devices)."""
    from jax._src import mesh as mesh_lib  # lazy: JAX starts once the device pool is sized

    return mesh_lib.get_abstract_mesh().abstract_device


@contextlib.contextmanager
def _absl_flags_of_no_command_line() -> Iterator[None]:
    """tokamax reads its options (`tokamax_autotuning_cache_miss_fallback`, …) as absl flags and, the first time
    one is read with no flags parsed yet, parses `sys.argv` for them: the command line of this process
    (`shardscope dump … --topology …`, pytest's), not MaxText's, which absl refuses ("Unknown command line flag
    'topology'"). For the build the flags count as parsed with their defaults, as under MaxText's own command
    line without such flags; if nothing had parsed them before, they are unparsed again on exit."""
    from absl import flags  # lazy: MaxText's dependency

    if flags.FLAGS.is_parsed():
        yield
        return
    flags.FLAGS.mark_as_parsed()
    try:
        yield
    finally:
        flags.FLAGS.unparse_flags()


@contextlib.contextmanager
def on_target(case: MaxTextCase, mesh: Any) -> Iterator[None]:
    """The build's view of its target and options: for a TPU topology, the kernels' (`_kernels_see_target`);
    for a GPU cluster, tokamax's (`_tokamax_sees`); on the CPU route the host is the target. Either way
    tokamax's options are its defaults (`_absl_flags_of_no_command_line`)."""
    if case.topology.gpu is not None:
        with _absl_flags_of_no_command_line(), _tokamax_sees(mesh.devices.flat[0]):
            yield
        return
    if case.topology.tpu is None:
        with _absl_flags_of_no_command_line():
            yield
        return
    with _absl_flags_of_no_command_line(), _kernels_see_target(mesh.devices.flat[0]):
        yield
