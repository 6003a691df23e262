"""`verify maxtext:MODEL --maxtext '…' [--against one-device | --against 'k=v …']`: MaxText's own train step run
for real under two of its command lines (or one and a single device) and compared.

Both sides run the step MaxText builds (`stages.maxtext_program`), from the same state: MaxText's own
initial state of the first side's command line (its init, its seed), moved onto the other side's shardings,
and on the same batch, MaxText's synthetic one (`stages.maxtext_train`). What is compared, per step: the loss,
every gradient `train_step` computes (before clipping), every updated parameter, AdamW's moments and the rest
of the train state (counts and keys, which must be equal).

- `--against one-device`: the same command line with every `ici_*_parallelism` at 1, on one CPU device, with
  the same global batch (the per-device batch times the devices; MaxText is told it runs on one device with
  `internal_compile_num_devices=1`, as it sizes its batch by the device count).
- `--against 'k=v …'`: the first side's command line with those keys changed (another mesh, another rule file
  with `custom_mesh_and_rule=…`, ZeRO-1, a remat policy), on the same devices.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import yaml

from shardscope.case.maxtext_model import MaxTextCase, MaxTextError
from shardscope.case.maxtext_run import parse_maxtext_args
from shardscope.case.rules import Spec
from shardscope.case.topology import get_topology, mesh_label
from shardscope.extract.state_paths import canonical_state_path
from shardscope.extract.tensors import normalize_spec, spec_of
from shardscope.plan.document import Plan
from shardscope.stages.maxtext_program import MaxTextStep, build_maxtext_step
from shardscope.stages.maxtext_train import (
    LOSS,
    TrainProgram,
    as_state_of,
    compile_train_program,
    initial_state,
    step_rng,
    synthetic_batch,
)
from shardscope.stages.train_step import AdamW
from shardscope.verify.cases import check_runs_here
from shardscope.verify.compare import compare_runs
from shardscope.verify.program import ProgramReading
from shardscope.verify.records import VerifyReport
from shardscope.verify.run import ONE_DEVICE, SideRun, step_readings
from shardscope.verify.verdict import build_report

# What verify adds to the one-device side's command line besides its ici_* keys at 1.
ONE_DEVICE_KEYS = (("internal_compile", "true"), ("internal_compile_num_devices", "1"))
# Keys verify sets itself (the device count MaxText sizes its batch by); the model and topology keys are refused
# as for any maxtext: case.
_FIXED = ("internal_compile", "internal_compile_num_devices")


def _format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@functools.cache
def _ici_keys(base_config: str) -> tuple[str, ...]:
    """MaxText's ICI parallelism keys, as its base.yml has them."""
    with open(base_config, encoding="utf-8") as file:
        keys = yaml.safe_load(file)
    return tuple(k for k in keys if k.startswith("ici_") and k.endswith("_parallelism"))


def _with_keys(args: Sequence[tuple[str, str]], changes: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """A command line with keys changed (in place) or added (at the end)."""
    changed = dict(changes)
    kept = [(key, changed.pop(key, value)) for key, value in args]
    return (*kept, *changed.items())


def one_device_case(case: MaxTextCase, config: Any) -> MaxTextCase:
    """The case's command line on one CPU device: every `ici_*_parallelism` 1, and the same global batch (the
    per-device batch times the devices, on a MaxText told it has one device)."""
    for key, _ in case.args:
        if key in _FIXED:
            raise MaxTextError(f"--maxtext {key}=…: verify sets it for the one-device side")
    per_device = float(config.per_device_batch_size) * case.topology.num_devices
    changes = [(key, "1") for key in _ici_keys(str(case.tree.base_config))]
    changes += [("per_device_batch_size", _format_number(per_device)), *ONE_DEVICE_KEYS]
    return dataclasses.replace(case, topology=get_topology("cpu-1"), args=_with_keys(case.args, changes))


def against_case(case: MaxTextCase, words: str) -> MaxTextCase:
    """The case's command line with the keys of `--against 'k=v …'` changed, on the same devices.

    Raises:
      ShardscopeError: words that are not MaxText keys, or keys that name the model or topology.
    """
    changes = parse_maxtext_args(words)
    for key, _ in changes:
        if key in ("model_name", "compile_topology", "compile_topology_num_slices", "hardware", *_FIXED):
            raise MaxTextError(f"--against {key}=…: both sides run maxtext:{case.model} on {case.topology.name}")
    return dataclasses.replace(case, args=_with_keys(case.args, changes))


def side_label(step: MaxTextStep) -> str:
    """`fsdp=4,tensor=2`: the mesh axes that split a side's devices (one device: `one device`)."""
    if step.mesh.size == 1:
        return ONE_DEVICE
    return mesh_label(tuple((str(axis), int(size)) for axis, size in step.mesh.shape.items() if size > 1))


def check_same_step(step: MaxTextStep, other: MaxTextStep) -> None:
    """Both sides must train on the same batch and compare AdamW's update.

    Raises:
      MaxTextError: a different global batch or sequence length, or an optimizer other than AdamW.
    """
    mine, theirs = step.config, other.config
    for key in ("global_batch_size_to_load", "global_batch_size_to_train_on", "max_target_length"):
        if getattr(mine, key) != getattr(theirs, key):
            raise MaxTextError(
                f"the two sides of maxtext:{step.case.model} train on different batches ({key} "
                f"{getattr(mine, key)} vs {getattr(theirs, key)}); verify compares the same step under two shardings"
            )
    for config in (mine, theirs):
        if str(getattr(config.opt_type, "value", config.opt_type)) != "adamw":
            raise MaxTextError(
                f"verify bounds AdamW's updates; maxtext:{step.case.model} trains with opt_type={config.opt_type}"
            )


def adamw_of(config: Any) -> AdamW:
    """AdamW's settings of a MaxText config, for the bounds of `verify.tolerance` rule 3: the schedule's peak
    learning rate (no step moves further), and no weight decay (MaxText's mask exempts some weights; a
    decay only shrinks a difference)."""
    return AdamW(
        learning_rate=float(config.learning_rate),
        b1=float(config.adam_b1),
        b2=float(config.adam_b2),
        eps=float(config.adam_eps),
        weight_decay=0.0,
    )


def _key_text(key: Any) -> str:
    return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))


def _host(value: Any) -> np.ndarray:
    """An output on the host; a PRNG key as its words (keys must come out equal)."""
    import jax  # lazy: JAX starts once the device pool is sized

    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        value = jax.random.key_data(value)
    return np.asarray(value)


@dataclasses.dataclass(frozen=True)
class _Outputs:
    """Which flattened outputs of the program are compared, under which names."""

    indices: tuple[int, ...]
    paths: tuple[str, ...]


def _outputs(step: MaxTextStep, out_info: Any) -> _Outputs:
    """The step's outputs (new state, metrics, gradients) flattened: the state under its plan paths, the loss,
    and each gradient as `grads/params/…`; the other metrics are left out (they are norms of these)."""
    import jax  # lazy: JAX starts once the device pool is sized

    state, metrics, grads = out_info
    indices: list[int] = []
    paths: list[str] = []
    offset = 0
    for key_path, _ in jax.tree_util.tree_flatten_with_path(state)[0]:
        indices.append(offset)
        paths.append(canonical_state_path([_key_text(k) for k in key_path]))
        offset += 1
    for key_path, _ in jax.tree_util.tree_flatten_with_path(metrics)[0]:
        if [_key_text(k) for k in key_path] == ["scalar", LOSS]:
            indices.append(offset)
            paths.append("loss")
        offset += 1
    root = "model" if step.nnx else "params"
    for key_path, _ in jax.tree_util.tree_flatten_with_path(grads)[0]:
        indices.append(offset)
        paths.append("grads/" + canonical_state_path([root, *(_key_text(k) for k in key_path)]))
        offset += 1
    if "loss" not in paths:
        raise MaxTextError(f"maxtext:{step.case.model}: MaxText's train step reports no {LOSS}")
    return _Outputs(tuple(indices), tuple(paths))


def state_shardings(step: MaxTextStep) -> Any:
    """The shardings the step takes its state in (ZeRO-1's, where the command line asks for it)."""
    if step.train is None:
        raise MaxTextError(f"maxtext:{step.case.model}: the step was built without its train function")
    return step.train.in_shardings[0]


def run_side(step: MaxTextStep, program: TrainProgram, state: Any, batch: dict[str, Any], steps: int) -> SideRun:
    """MaxText's step run `steps` times from `state` (placed as the step takes it; donated) on `batch`."""
    import jax  # lazy: JAX starts once the device pool is sized

    chosen = _outputs(step, program.compiled.out_info)
    placed = jax.device_put(batch, step.batch_sharding)
    values = []
    for index in range(steps):
        args = (state, placed) if step.nnx else (state, placed, step_rng(step, index))
        state, metrics, grads = program.compiled(*args)
        flat = jax.tree.leaves((state, metrics, grads))
        values.append(tuple(_host(flat[i]) for i in chosen.indices))
    state_leaves = len(jax.tree.leaves(program.compiled.out_info[0]))
    readings = tuple(
        ProgramReading(
            tuple(reading.precisions[i] for i in chosen.indices),
            tuple(reading.computed_at[i] for i in chosen.indices),
        )
        for reading in step_readings(program.jaxpr, steps, state_leaves)
    )
    specs: dict[str, Spec] = {}
    if step.mesh.size > 1:
        shapes = jax.tree.leaves(program.compiled.out_info)
        shardings = jax.tree.leaves(program.compiled.output_shardings)
        for i, path in zip(chosen.indices, chosen.paths, strict=True):
            specs[path] = normalize_spec(spec_of(shardings[i]), len(shapes[i].shape))
    return SideRun(side_label(step), chosen.paths, tuple(values), readings, specs)


def _plan(step: MaxTextStep, program: TrainProgram) -> Plan | None:
    """A sharded side's plan, from the very program that ran (its collectives name what a divergence touches)."""
    from shardscope.extract.maxtext_plan import maxtext_plan  # lazy: only a divergence needs the plan

    if step.mesh.size == 1:
        return None
    return maxtext_plan(dataclasses.replace(step, compiled=program.compiled))


def verify_maxtext(case: MaxTextCase, against: str | None, steps: int) -> VerifyReport:
    """Runs `steps` of MaxText's train step of `case` and of `against` (None: the same command line on one
    device; else MaxText keys changed on the same devices) from MaxText's initial state and synthetic batch,
    and compares the losses, gradients, parameters, moments and the rest of the state.

    Raises:
      ShardscopeError: no steps, a TPU topology, a MaxText that refuses either command line, sides that train
        on different batches or return different state.
    """
    import jax  # lazy: JAX starts once the device pool is sized

    check_runs_here(steps, case.topology)
    step = build_maxtext_step(case, lower=False, compile_step=False)
    if against is None:
        first = min(jax.devices(), key=lambda d: d.id)
        other = build_maxtext_step(one_device_case(case, step.config), lower=False, compile_step=False, devices=[first])
    else:
        other = build_maxtext_step(against_case(case, against), lower=False, compile_step=False)
    check_same_step(step, other)
    start = initial_state(step)
    batch = synthetic_batch(step)
    programs = compile_train_program(step), compile_train_program(other)
    # A copy each (each side's step donates the state it is given).
    starts = [
        jax.device_put(as_state_of(side, start), state_shardings(side), may_alias=False) for side in (step, other)
    ]
    mine = run_side(step, programs[0], starts[0], batch, steps)
    reference = run_side(other, programs[1], starts[1], batch, steps)
    if mine.label == reference.label:
        reference = dataclasses.replace(reference, label=f"{reference.label} (--against)")
    checks = compare_runs(mine, reference, adamw_of(step.config))
    plans = {mine.label: (step, programs[0]), reference.label: (other, programs[1])}
    return build_report(case.name, case.topology.name, mine, reference, checks, lambda run: _plan(*plans[run.label]))
