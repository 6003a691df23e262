"""Your own JAX program as a case: `module:function` names a function that builds a jitted step.

The protocol, kept small so that any training loop can offer it:

    def make_step(devices):            # or make_step() when it builds its mesh from jax.devices()
        mesh = jax.sharding.Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
        step = jax.jit(train_step, in_shardings=..., out_shardings=...)
        return step, (params, batch), mesh

`devices` are the topology's devices (`cpu-N`: N fake CPU devices; a TPU slice: its devices, compiled
ahead of time); `args` may be arrays or `jax.ShapeDtypeStruct`s (abstract ones allocate nothing). The
module is imported from the working directory (`my_pkg.steps:make_step`) or from a file path
(`steps/train.py:make_step`). Everything the user's code can get wrong is one line: an import that fails,
a missing function, a function that raises or returns something else, a mesh of the wrong size.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardscope.case.topology import Topology
from shardscope.errors import ShardscopeError
from shardscope.stages.devices import tpu_devices


class StepError(ShardscopeError):
    """A `--step` that cannot be imported, called or compiled as the protocol says."""


@dataclass(frozen=True)
class StepRef:
    """`module:function` (or `path/to/file.py:function`) as the user wrote it."""

    module: str
    function: str

    @property
    def text(self) -> str:
        """The reference as written on the command line."""
        return f"{self.module}:{self.function}"

    @property
    def name(self) -> str:
        """The plan's default name: the function's."""
        return self.function


def parse_step_ref(text: str) -> StepRef:
    """Parses `my_pkg.steps:make_step` or `steps/train.py:make_step`.

    Raises:
      StepError: no colon, or an empty module or function part.
    """
    module, sep, function = text.rpartition(":")
    if not sep or not module or not function.isidentifier():
        raise StepError(f"--step {text!r}: expected module:function, e.g. my_pkg.steps:make_step")
    return StepRef(module, function)


def _import(ref: StepRef) -> Any:
    if ref.module.endswith(".py"):
        path = Path(ref.module)
        if not path.is_file():
            raise StepError(f"--step {ref.text}: file {path} does not exist")
        spec = importlib.util.spec_from_file_location(f"shardscope_step_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise StepError(f"--step {ref.text}: cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    # A console script does not put the working directory on sys.path; a project's own steps live there.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return importlib.import_module(ref.module)


def load_step_function(ref: StepRef) -> Callable[..., Any]:
    """The function a reference names.

    Raises:
      StepError: the module does not import (its own error, in one line) or lacks a callable of that name.
    """
    try:
        module = _import(ref)
    except StepError:
        raise
    except Exception as err:  # the user's module: any error it raises is theirs to fix
        raise StepError(f"--step {ref.text}: cannot import {ref.module} ({one_line(err)})") from None
    function = getattr(module, ref.function, None)
    if function is None:
        raise StepError(f"--step {ref.text}: {ref.module} has no attribute {ref.function!r}")
    if not callable(function):
        raise StepError(f"--step {ref.text}: {ref.function} is a {type(function).__name__}, not a function")
    return function


def _article(noun: str) -> str:
    return "an" if noun[:1].lower() in "aeiou" else "a"


def one_line(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    message = str(err).strip().splitlines()
    return f"{type(err).__name__}: {message[0]}" if message else type(err).__name__


def topology_devices(topology: Topology) -> list[Any]:
    """The devices a step's mesh is built from: the first N CPU devices, or the TPU slice's devices."""
    import jax  # lazy: JAX starts only once the device pool is sized

    if topology.tpu is not None:
        return list(tpu_devices(topology.tpu, topology.slices).devices)
    devices = sorted(jax.devices(), key=lambda d: d.id)
    if len(devices) < topology.num_devices:
        raise StepError(
            f"topology {topology.name} needs {topology.num_devices} devices but this process has {len(devices)}"
        )
    return devices[: topology.num_devices]


def call_step_function(
    function: Callable[..., Any], ref: StepRef, devices: Sequence[Any]
) -> tuple[Any, tuple[Any, ...], Any]:
    """Calls a `make_step` function on the devices: (jitted step, args, mesh), each checked (StepError)."""
    takes_devices = bool(inspect.signature(function).parameters)
    try:
        result = function(list(devices)) if takes_devices else function()
    except Exception as err:  # the user's code
        raise StepError(f"--step {ref.text}: {ref.function} raised {one_line(err)}") from None
    if not isinstance(result, tuple | list) or len(result) != 3:
        noun = type(result).__name__
        kind = f"a {len(result)}-tuple" if isinstance(result, tuple | list) else f"{_article(noun)} {noun}"
        raise StepError(f"--step {ref.text}: {ref.function} must return (jitted step, args, mesh), returned {kind}")
    step, args, mesh = result
    import jax  # lazy: JAX starts only once the device pool is sized

    if not hasattr(step, "lower"):
        raise StepError(f"--step {ref.text}: the step it returned is not jitted (wrap it in jax.jit)")
    if not isinstance(mesh, jax.sharding.Mesh):
        raise StepError(f"--step {ref.text}: the third value must be a jax.sharding.Mesh, not {type(mesh).__name__}")
    if not isinstance(args, tuple | list):
        raise StepError(f"--step {ref.text}: args must be a tuple of the step's positional arguments")
    if mesh.size != len(devices):
        raise StepError(
            f"--step {ref.text}: its mesh has {mesh.size} devices but the topology has {len(devices)} "
            "(build the mesh from the devices passed in)"
        )
    return step, tuple(args), mesh


def compile_step(step: Any, args: Sequence[Any], mesh: Any) -> Any:
    """Lowers and compiles a jitted function on `args` (arrays or `jax.ShapeDtypeStruct`s) with its mesh set
    while tracing, as explicit sharding needs."""
    import jax  # lazy: JAX starts only once the device pool is sized

    with jax.set_mesh(mesh):
        return step.lower(*args).compile()


def compile_traced_step(step: Any, args: Sequence[Any], mesh: Any) -> tuple[Any, Any]:
    """As `compile_step`, keeping the traced program too: (compiled, its ClosedJaxpr), what `verify` runs
    and reads."""
    import jax  # lazy: JAX starts only once the device pool is sized

    with jax.set_mesh(mesh):
        traced = step.trace(*args)
        return traced.lower().compile(), traced.jaxpr
