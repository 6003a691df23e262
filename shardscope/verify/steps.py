"""`verify --step FILE.py:make_step --against one-device`: a program of one's own run on the topology's
devices and on one device, from the arguments `make_step` returns for each, and its outputs compared.

`make_step` is called twice (`shardscope.stages.user_step`'s protocol): with the topology's devices, and with
the first of them alone. Both calls must return the same numbers as arguments (seeded the same), placed as
each mesh needs; they must be arrays, since the step runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from shardscope.case.topology import Topology
from shardscope.errors import ShardscopeError
from shardscope.stages.state import path_of
from shardscope.stages.user_step import (
    StepError,
    StepRef,
    call_step_function,
    compile_traced_step,
    one_line,
    topology_devices,
)
from shardscope.verify.compare import compare_runs
from shardscope.verify.records import VerifyReport
from shardscope.verify.run import ONE_DEVICE, SideRun, run_program
from shardscope.verify.verdict import build_report


def check_concrete(args: Sequence[Any], ref: StepRef) -> None:
    """The arguments must be arrays: a `jax.ShapeDtypeStruct` plans but cannot run.

    Raises:
      StepError: the first abstract argument, by path.
    """
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(tuple(args))[0]:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            raise StepError(
                f"--step {ref.text}: verify runs the step, so its arguments must be arrays, but argument "
                f"{path_of(key_path) or '0'} is a jax.ShapeDtypeStruct (return arrays from {ref.function})"
            )


# A step's arguments on the host by path, taken before the step runs (it may donate them).
Snapshot = list[tuple[str, np.ndarray]]


def snapshot(args: Sequence[Any]) -> Snapshot:
    """The arguments' values on the host, by path."""
    return [(path_of(p), np.asarray(leaf)) for p, leaf in jax.tree_util.tree_flatten_with_path(tuple(args))[0]]


def check_same_arguments(sharded: Snapshot, single: Snapshot, ref: StepRef) -> None:
    """Both calls of `make_step` must give the step the same numbers.

    Raises:
      StepError: the first argument whose structure, shape or values differ.
    """
    if [path for path, _ in sharded] != [path for path, _ in single]:
        raise StepError(f"--step {ref.text}: {ref.function} returns differently structured arguments for one device")
    for (path, a), (_, b) in zip(sharded, single, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b, equal_nan=True):
            raise StepError(
                f"--step {ref.text}: argument {path or '0'} differs between the call with the topology's devices "
                f"and the call with one device; seed {ref.function}'s data the same for both"
            )


def _mesh_label(mesh: Any) -> str:
    shown = ",".join(f"{axis}={size}" for axis, size in mesh.shape.items() if size > 1)
    return f"{mesh.size} devices ({shown})" if shown else f"{mesh.size} devices"


def _run(step: Any, args: Sequence[Any], mesh: Any, ref: StepRef, label: str) -> SideRun:
    try:
        compiled, jaxpr = compile_traced_step(step, args, mesh)
        return run_program(label, compiled, jaxpr, args, mesh)
    except ShardscopeError:
        raise
    except Exception as err:  # tracing, compiling or running the user's program
        raise StepError(f"--step {ref.text}: running the step failed ({one_line(err)})") from None


def verify_step_function(function: Callable[..., Any], ref: StepRef, topology: Topology) -> VerifyReport:
    """Runs a `make_step` program on the topology's devices and on one device and compares its outputs.

    Raises:
      StepError: what the protocol rules out, abstract arguments, arguments that differ between the calls, a
        step that fails to run (its first line).
    """
    if topology.platform != "cpu":
        raise ShardscopeError(f"verify runs real steps on fake CPU devices: use --topology cpu-N, not {topology.name}")
    devices = topology_devices(topology)
    sharded = call_step_function(function, ref, devices)
    check_concrete(sharded[1], ref)
    single = call_step_function(function, ref, devices[:1])
    check_concrete(single[1], ref)
    check_same_arguments(snapshot(sharded[1]), snapshot(single[1]), ref)
    side = _run(*sharded, ref, _mesh_label(sharded[2]))
    reference = _run(*single, ref, ONE_DEVICE)
    checks = compare_runs(side, reference, None)
    return build_report(ref.text, topology.name, side, reference, checks, lambda run: None)
