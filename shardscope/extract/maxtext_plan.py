"""MaxText's own train step (`maxtext:MODEL`) → Plan, with the extractors every other plan uses.

Tensors are named as MaxText's sharding dump names them, normalised as `import-maxtext` normalises them
(`params/decoder/…`, `opt_state/0/mu/…`, `activations/<file>/<name>`), so a `maxtext:` plan and MaxText's own
dump of the same command line compare entry for entry. Collectives, memory, work and causes come from the
compiled module as for any plan; a cause's rules are MaxText's `logical_axis_rules` of that command line.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from shardscope.case.rules import drop_unit_axes
from shardscope.extract.collectives import extract_collectives
from shardscope.extract.links import with_links
from shardscope.extract.maxtext_dump import activation_records, read_activations, state_record
from shardscope.extract.plans import compute_of, memory_of, provenance
from shardscope.extract.state_paths import canonical_state_path
from shardscope.extract.tensors import normalize_spec, output_tensors, spec_of
from shardscope.hlo.executions import Program
from shardscope.hlo.module import read_module
from shardscope.hlo.profile import work_profile
from shardscope.plan.document import Plan
from shardscope.plan.records import SCHEMA, TENSORS_ONLY, CaseRecord, TensorRecord, tensor_record
from shardscope.stages.maxtext_program import MaxTextStep, maxtext_rules


def _is_spec(leaf: Any) -> bool:
    return leaf is None or isinstance(leaf, jax.sharding.PartitionSpec)


def _linen_logical(step: MaxTextStep) -> dict[str, tuple[str | None, ...]]:
    """MaxText's logical annotation of every state leaf of a Linen train state, by its normalised path."""
    leaves = jax.tree_util.tree_flatten_with_path(step.logical, is_leaf=_is_spec)[0]
    return {_state_path(key_path): logical_names(leaf) for key_path, leaf in leaves if leaf is not None}


def logical_names(entries: Any) -> tuple[str | None, ...]:
    """A logical annotation's names, one per dimension (None: unnamed). MaxText names each dimension once;
    a dimension given several names (never seen in MaxText's models) keeps them joined by commas."""
    return tuple(None if e is None else e if isinstance(e, str) else ",".join(map(str, e)) for e in entries)


def _state_path(key_path: Any) -> str:
    """A state leaf's plan path from its pytree keys, a Linen `TrainState`'s and an NNX state's alike."""
    return canonical_state_path([str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in key_path])


def _nnx_variables(state: Any) -> dict[str, Any] | None:
    """An NNX state's Variables by path (their metadata holds the logical axes); None for a Linen state."""
    from flax import nnx  # lazy: flax loads with MaxText

    if not isinstance(state, nnx.State):
        return None
    leaves = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
    return {_state_path(key_path): variable for key_path, variable in leaves}


def _nnx_kind(variable: Any) -> str:
    from flax import nnx  # lazy: flax loads with MaxText

    # The rest of the train state (optimizer moments and counts, the model's RNG keys and counts) is state the
    # step carries but does not differentiate: "opt_state", as for a Linen state.
    return "param" if isinstance(variable, nnx.Param) else "opt_state"


def _state_tensors(step: MaxTextStep, sizes: dict[str, int]) -> dict[str, TensorRecord]:
    variables = _nnx_variables(step.state)
    logical = _linen_logical(step) if variables is None else {}
    leaves = jax.tree_util.tree_flatten_with_path(step.state)[0]
    shardings = jax.tree_util.tree_leaves(step.state_shardings)
    tensors: dict[str, TensorRecord] = {}
    for (key_path, leaf), sharding in zip(leaves, shardings, strict=True):
        spec = normalize_spec(spec_of(sharding), len(leaf.shape))
        shape = tuple(leaf.shape)
        path = _state_path(key_path)
        if path == "step":
            continue  # the train state's step counter: a scalar no sharding rule touches, as import-maxtext
        if variables is None:
            tensors[path] = state_record(path, shape, leaf.dtype, logical.get(path, ()), spec, sizes)
            continue
        variable = variables[path]
        names = variable.get_metadata().get("out_sharding") or ()
        axes = logical_names(names) if len(names) == len(shape) else None
        tensors[path] = tensor_record(_nnx_kind(variable), shape, leaf.dtype, axes, drop_unit_axes(spec, sizes), sizes)
    return tensors


def _input_tensors(step: MaxTextStep, sizes: dict[str, int]) -> dict[str, TensorRecord]:
    logical = tuple(step.config.input_data_sharding_logical_axes)
    tensors: dict[str, TensorRecord] = {}
    for name, leaf in sorted(step.batch.items()):
        spec = normalize_spec(spec_of(step.batch_sharding), len(leaf.shape))
        named = logical if len(logical) == len(leaf.shape) else None
        tensors[f"inputs/{name}"] = tensor_record("input", leaf.shape, leaf.dtype, named, spec, sizes)
    return tensors


def maxtext_tensors(step: MaxTextStep) -> tuple[tuple[str, TensorRecord], ...]:
    """Every tensor of MaxText's step: its state, its inputs, its activation constraints and (lowered) its
    outputs, sorted by path."""
    sizes = {str(axis): int(size) for axis, size in step.mesh.shape.items()}
    tensors = _state_tensors(step, sizes)
    tensors.update(_input_tensors(step, sizes))
    tensors.update(activation_records(read_activations(step.activations, "MaxText's activation dump"), sizes))
    source = step.compiled if step.compiled is not None else step.lowered
    if source is not None:
        outputs = output_tensors(source.out_info, sizes, {}, train_step=True)
        for path, record in outputs.items():
            # The new state under the state's own names (`outputs/params/…`), as its inputs are named.
            name = canonical_state_path(path.removeprefix("outputs/").split("/"))
            if name != "step":
                tensors[f"outputs/{name}"] = record
    return tuple(sorted(tensors.items()))


def _case_record(step: MaxTextStep) -> CaseRecord:
    explicit = any(str(t) == "Explicit" for t in getattr(step.mesh, "axis_types", ()))
    return CaseRecord(
        model=step.case.name,
        preset=step.case.rule,
        topology=step.case.topology.name,
        mesh=tuple((str(axis), int(size)) for axis, size in step.mesh.shape.items()),
        axis_types="explicit" if explicit else "auto",
        overrides=step.case.args,
    )


def _provenance(step: MaxTextStep, platform: str) -> tuple[tuple[str, Any], ...]:
    tree = step.case.tree
    source = str(tree.src) if tree.checkout else "installed package"
    notes = [("maxtext", f"{tree.version} ({source})")]
    if step.case.renamed:  # the command line's keys the tree knows under another name (`case.overrides` has it)
        notes.append(("maxtext_renamed", ", ".join(f"{old} -> {new}" for old, new in step.case.renamed)))
    return tuple(sorted((*provenance(platform, {}), *notes)))


def slice_mesh(step: MaxTextStep) -> tuple[tuple[str, int], ...]:
    """The mesh one slice's compiled module refers to: each axis over its ICI size (MaxText sizes an axis ICI ×
    DCN; a program for several slices is compiled per slice, its traffic between slices host transfers)."""
    slices = step.case.topology.slices
    mesh = tuple((str(axis), int(size)) for axis, size in step.mesh.shape.items())
    if slices == 1 or step.case.topology.gpu is not None:
        return mesh  # a GPU cluster's program is one for every GPU: its groups number them all
    dcn = [int(d) for d in getattr(step.config, "dcn_parallelism", [1] * len(mesh))]
    known = math.prod(d for d in dcn if d != -1)
    dcn = [slices // known if d == -1 else d for d in dcn]  # MaxText fills one -1 with the remaining slices
    return tuple((axis, size // d) for (axis, size), d in zip(mesh, dcn, strict=True))


def maxtext_plan(step: MaxTextStep) -> Plan:
    """The plan of MaxText's step: tensors-only when it was not compiled."""
    platform = step.case.topology.platform
    record = _case_record(step)
    tensors = maxtext_tensors(step)
    if step.compiled is None:
        return Plan(
            case=record,
            provenance=_provenance(step, platform),
            tensors=tensors,
            schema=SCHEMA,
            parts=TENSORS_ONLY,
        )
    module = read_module(step.compiled.as_text())
    program = Program(module)  # its tables and executions, read once for the compute and the work profile
    cpu, explicit = platform == "cpu", record.axis_types == "explicit"
    collectives = extract_collectives(
        module,
        slice_mesh(step),
        narrow=cpu,
        explain=(dict(tensors), maxtext_rules(step.config)),
        moved_out=cpu and not explicit,
    )
    if step.case.topology.gpu is not None:
        collectives = with_links(collectives, step.mesh, step.case.topology.gpu)
    return Plan(
        case=record,
        provenance=_provenance(step, platform),
        tensors=tensors,
        collectives=collectives,
        memory=memory_of(step.compiled, platform),
        schema=SCHEMA,
        compute=compute_of(module, program),
        work=work_profile(module, cpu_program=cpu, explicit_reductions=explicit, program=program),
    )
