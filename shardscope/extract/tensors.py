"""The tensors of a plan, as the traced or compiled step places them: parameters and optimizer state (by
the rules), inputs, every activation constraint the trace recorded, and the outputs the program returns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from reference_models.sharding import ActivationRecord
from shardscope.case.rules import Spec, normalize_entry
from shardscope.plan.records import TensorRecord, tensor_record
from shardscope.stages.compile import CompiledStep, TracedStep
from shardscope.stages.state import path_of


def normalize_spec(spec: Any, ndim: int) -> Spec:
    """A PartitionSpec as the plan's tuple: one entry per dimension, None / "axis" / ("a", "b")."""
    entries = tuple(normalize_entry(e) for e in tuple(spec))
    return entries + (None,) * (ndim - len(entries))


def _state_tensors(step: CompiledStep | TracedStep, mesh: dict[str, int]) -> dict[str, TensorRecord]:
    tensors: dict[str, TensorRecord] = {}
    abstract = step.abstract
    leaves = jax.tree_util.tree_flatten_with_path(abstract.state)[0]
    shardings = jax.tree_util.tree_leaves(abstract.state_shardings)
    for (key_path, leaf), sharding in zip(leaves, shardings, strict=True):
        path = path_of(key_path)
        kind = "param" if path.startswith("params/") else "opt_state"
        spec = normalize_spec(sharding.spec, len(leaf.shape))
        tensors[path] = tensor_record(kind, leaf.shape, leaf.dtype, abstract.logical.get(path), spec, mesh)
    for name, leaf in abstract.batch.items():
        spec = normalize_spec(abstract.batch_shardings[name].spec, len(leaf.shape))
        logical = step.case.preset.input_data_sharding_logical_axes
        tensors[f"inputs/{name}"] = tensor_record("input", leaf.shape, leaf.dtype, logical, spec, mesh)
    return tensors


def _activation_tensors(records: Sequence[ActivationRecord], mesh: dict[str, int]) -> dict[str, TensorRecord]:
    """One entry per traced constraint; a module traced twice (scan does) records the same entry twice."""
    tensors: dict[str, TensorRecord] = {}
    for record in records:
        spec = normalize_spec(record.spec, len(record.shape))
        entry = tensor_record("activation", record.shape, record.dtype, record.logical, spec, mesh)
        path = f"activations/{record.path}"
        suffix = 1
        while path in tensors and tensors[path] != entry:
            suffix += 1
            path = f"activations/{record.path}#{suffix}"
        tensors[path] = entry
    return tensors


def output_tensors(
    out_info: Any, mesh: dict[str, int], logical: dict[str, tuple[str | None, ...]], train_step: bool
) -> dict[str, TensorRecord]:
    """The shardings the program returns: the compiled program's own, or the lowered one's (as requested).

    A train step returns (state, metrics), whose parts have distinct names, so its tuple index is left out
    of a tensor's name; any other function's outputs keep it (`(params, grads)` with the same keys are
    `outputs/0/w` and `outputs/1/w`), and a lone value is `outputs`.
    """
    tensors: dict[str, TensorRecord] = {}
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(out_info)[0]:
        path = path_of(key_path[1:] if train_step and isinstance(out_info, tuple) else key_path)
        spec = normalize_spec(spec_of(leaf.sharding), len(leaf.shape))
        name = f"outputs/{path}" if path else "outputs"
        tensors[name] = tensor_record("output", leaf.shape, leaf.dtype, logical.get(path), spec, mesh)
    return tensors


def spec_of(sharding: Any) -> Any:
    """A sharding's PartitionSpec; a program jitted without a mesh keeps each value on one device, whole."""
    return getattr(sharding, "spec", jax.sharding.PartitionSpec())


def input_tensors(compiled: Any, mesh: dict[str, int]) -> dict[str, TensorRecord]:
    """Arguments of any compiled function, as the compiled program takes them.

    An argument the program never reads is dropped by jit (its sharding is None): it is not an input of the
    compiled program, so it is left out rather than given a placement it does not have.
    """
    tensors: dict[str, TensorRecord] = {}
    avals = jax.tree_util.tree_flatten_with_path(compiled.in_avals[0])[0]
    shardings = jax.tree_util.tree_leaves(compiled.input_shardings[0], is_leaf=lambda leaf: leaf is None)
    for (key_path, aval), sharding in zip(avals, shardings, strict=True):
        if sharding is None:
            continue
        spec = normalize_spec(spec_of(sharding), len(aval.shape))
        tensors[f"inputs/{path_of(key_path)}"] = tensor_record("input", aval.shape, aval.dtype, None, spec, mesh)
    return tensors


def step_tensors(step: CompiledStep | TracedStep, out_info: Any) -> tuple[tuple[str, TensorRecord], ...]:
    """Every tensor of a traced step, sorted by path; its outputs as `out_info` describes them."""
    mesh = step.case.mesh_sizes
    tensors = _state_tensors(step, mesh)
    tensors.update(_activation_tensors(step.activations, mesh))
    tensors.update(output_tensors(out_info, mesh, step.abstract.logical, train_step=True))
    return tuple(sorted(tensors.items()))
