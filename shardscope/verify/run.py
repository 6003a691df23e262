"""Real steps on one side of a verification: a case's train step on its mesh, the same step on one device,
or a program of one's own; every output brought back to the host by path, with what the program says about
its rounding (`program.read_program`) and where each output lives.

A case's step is the one that is planned (`stages.compile.compile_case`), compiled once, with its gradients
as extra outputs; its plan is extracted from that compile only when a report needs its collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from shardscope.case.resolve import Case
from shardscope.case.rules import Spec
from shardscope.extract.tensors import normalize_spec, spec_of
from shardscope.stages.compile import CompiledStep, compile_case, compile_one_device
from shardscope.stages.state import path_of
from shardscope.stages.train_step import make_optimizer
from shardscope.verify.inputs import StartingPoint
from shardscope.verify.layout import ParamTree, corresponding_paths, same_layout, to_case_layout, to_stacked
from shardscope.verify.program import EXACT, Precision, ProgramReading, read_program

# A side's label for where its tensors live when it runs on one device.
ONE_DEVICE = "one device"
# A parameter-shaped tree moved from the layout a side computed it in to the layout compared.
Relayout = Callable[[ParamTree], ParamTree]


@dataclass(frozen=True)
class SideRun:
    """One side's results. `paths` name the outputs (`loss`, `grads/params/…`, `params/…`, `opt_state/…`;
    `outputs/…` of a program of one's own); `values[t][i]` is output i after step t + 1, on the host."""

    label: str
    paths: tuple[str, ...]
    values: tuple[tuple[np.ndarray, ...], ...]
    readings: tuple[ProgramReading, ...]  # per step: each output's precision and place in the step
    specs: Mapping[str, Spec]  # by this side's own output paths; empty on one device (whole, on one device)
    # Compared path → this side's own paths holding its values, where its parameters are laid out otherwise
    # (a pipelined case against an unpipelined one); None: the same paths.
    own_paths: Mapping[str, tuple[str, ...]] | None = None
    compiled_case: CompiledStep | None = field(default=None, repr=False)  # a preset side's, for its plan

    def paths_of(self, path: str) -> tuple[str, ...]:
        """This side's own names of a compared output."""
        return (path,) if self.own_paths is None else self.own_paths.get(path, ())


def train_output_path(key_path: Sequence[Any]) -> str:
    """A train step's output (state, metrics) by plan path: `params/…`, `opt_state/…`, `loss`, and a
    gradient as the plan names it, `grads/params/…`."""
    path = path_of(key_path[1:])
    return "grads/params/" + path.removeprefix("grads/") if path.startswith("grads/") else path


def _relaid(outputs: Any, relayout: Relayout) -> Any:
    """A train step's (state, metrics) with every parameter-shaped tree moved to the layout compared."""
    state, metrics = outputs
    adam, *rest = state["opt_state"]
    adam = adam._replace(mu=relayout(adam.mu), nu=relayout(adam.nu))
    state = {"params": relayout(state["params"]), "opt_state": (adam, *rest)}
    return state, {**metrics, "grads": relayout(metrics["grads"])}


def step_readings(jaxpr: Any, steps: int, state_inputs: int) -> tuple[ProgramReading, ...]:
    """Each step's reading of the program: the state a step starts from carries what the one before computed."""
    readings: list[ProgramReading] = []
    inputs = None
    for _ in range(steps):
        reading = read_program(jaxpr, inputs)
        readings.append(reading)
        carried = list(reading.precisions[:state_inputs])
        inputs = carried + [EXACT] * (len(jaxpr.jaxpr.invars) - state_inputs)
    return tuple(readings)


def _initial_state(case: Case, start: StartingPoint) -> dict[str, Any]:
    """The state a side starts from, on the host: the parameters in its layout, and AdamW's initial state,
    which is all zeros (its counts and moments), made from its shapes: run op by op, the optimizer's own
    init compiles a program per parameter shape."""
    params = to_case_layout(case.model, start.params)
    shapes = jax.eval_shape(make_optimizer(case.model.mu_dtype).init, params)
    return {"params": params, "opt_state": jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)}


def _run_steps(
    compiled: Any,
    place_state: Callable[[Any], Any],
    place_batch: Callable[[Any], Any],
    case: Case,
    start: StartingPoint,
) -> list[Any]:
    """Runs the compiled train step from the starting point, one batch a step; each step's outputs on the host."""
    state = place_state(_initial_state(case, start))
    results = []
    for batch in start.batches:
        state, metrics = compiled(state, place_batch(batch))
        results.append(jax.tree.map(np.asarray, (state, metrics)))
    return results


def _flat(outputs: Any) -> tuple[tuple[str, ...], tuple[np.ndarray, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(outputs)[0]
    return tuple(train_output_path(key_path) for key_path, _ in leaves), tuple(value for _, value in leaves)


def _side_run(label: str, results: list[Any], jaxpr: Any, relayout: Relayout | None, **extra: Any) -> SideRun:
    """A train step's side: its outputs by path (moved to the compared layout), and its program's readings,
    which are per output of its own layout (moved likewise: a moved leaf takes the worst of its sources)."""
    own_paths, _ = _flat(results[0])
    state_leaves = len(jax.tree.leaves(results[0][0]))
    readings = step_readings(jaxpr, len(results), state_leaves)
    if relayout is not None:
        results = [_relaid(outputs, relayout) for outputs in results]
    paths, _ = _flat(results[0])
    values = tuple(_flat(outputs)[1] for outputs in results)
    if relayout is not None:
        readings = tuple(_moved_reading(reading, own_paths, paths, extra["own_paths"]) for reading in readings)
    return SideRun(label, paths, values, readings, **extra)


def _moved_reading(
    reading: ProgramReading,
    own_paths: Sequence[str],
    paths: Sequence[str],
    sources: Mapping[str, tuple[str, ...]],
) -> ProgramReading:
    position = {path: i for i, path in enumerate(own_paths)}
    precisions: list[Precision] = []
    places: list[tuple[int, int]] = []
    for path in paths:
        found = [position[p] for p in sources.get(path, (path,)) if p in position]
        precisions.append(
            Precision(
                max((reading.precisions[i].reduction for i in found), default=0.0),
                max((reading.precisions[i].eps for i in found), default=0.0),
            )
        )
        places.append(max((reading.computed_at[i] for i in found), default=(-1, 0)))
    return ProgramReading(tuple(precisions), tuple(places))


def run_case(case: Case, start: StartingPoint, label: str, compare_in: Case | None = None) -> SideRun:
    """The case's train step compiled on its mesh and run for every batch of the starting point.

    `compare_in`: the case whose parameter layout the results are compared in, when it is not this one's.
    """
    step = compile_case(case, with_grads=True)
    results = _run_steps(
        step.compiled,
        lambda state: jax.device_put(state, step.abstract.state_shardings),
        lambda batch: jax.device_put(batch, step.abstract.batch_shardings),
        case,
        start,
    )
    own_paths, _ = _flat(results[0])
    shapes = jax.tree.leaves(step.compiled.out_info)
    shardings = jax.tree.leaves(step.compiled.output_shardings)
    specs = {
        path: normalize_spec(s.spec, len(leaf.shape))
        for path, s, leaf in zip(own_paths, shardings, shapes, strict=True)
    }
    relayout = _relayout(case, compare_in)
    mapping = None
    if relayout is not None and compare_in is not None:
        mapping = _output_paths_map(corresponding_paths(case.model, compare_in.model, step.abstract.state["params"]))
    return _side_run(label, results, step.jaxpr, relayout, specs=specs, own_paths=mapping, compiled_case=step)


def _output_paths_map(params: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The parameter path mapping extended to every output named after a parameter (its gradient, moments)."""
    mapping: dict[str, tuple[str, ...]] = {}
    for prefix in ("params/", "grads/params/", "opt_state/0/mu/", "opt_state/0/nu/"):
        for compared, own in params.items():
            mapping[prefix + compared] = tuple(prefix + path for path in own)
    return mapping


def run_one_device(case: Case, start: StartingPoint, device: Any) -> SideRun:
    """The case's train step on `device` alone, unsharded, run for every batch of the starting point."""
    step = compile_one_device(case, device)
    place = lambda tree: jax.device_put(tree, device)  # noqa: E731
    results = _run_steps(step.compiled, place, place, case, start)
    return _side_run(ONE_DEVICE, results, step.jaxpr, None, specs={})


def _relayout(case: Case, compare_in: Case | None) -> Relayout | None:
    if compare_in is None or same_layout(case.model, compare_in.model):
        return None
    return lambda tree: to_case_layout(compare_in.model, to_stacked(case.model, tree))


def output_path(key_path: Sequence[Any]) -> str:
    """A program's output by path: `outputs/0/w` (a lone value: `outputs`)."""
    path = path_of(key_path)
    return f"outputs/{path}" if path else "outputs"


def run_program(label: str, compiled: Any, jaxpr: Any, args: Sequence[Any], mesh: Any) -> SideRun:
    """A compiled program of one's own run once on its arguments; its outputs on the host by path."""
    with jax.set_mesh(mesh):
        outputs = compiled(*args)
    leaves = jax.tree_util.tree_flatten_with_path(jax.tree.map(np.asarray, outputs))[0]
    paths = tuple(output_path(key_path) for key_path, _ in leaves)
    shapes = jax.tree.leaves(compiled.out_info)
    specs = {
        path: normalize_spec(spec_of(s), len(leaf.shape))
        for path, s, leaf in zip(paths, jax.tree.leaves(compiled.output_shardings), shapes, strict=True)
        if mesh.size > 1
    }
    values = (tuple(value for _, value in leaves),)
    return SideRun(label, paths, values, (read_program(jaxpr),), specs)


def precision_of(run: SideRun, step: int, index: int) -> Precision:
    """What output `index` of step `step` (0-based) may carry on this side."""
    return run.readings[step].precisions[index]
