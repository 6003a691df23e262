"""A model's tensors under a preset, placed on any mesh without tracing again.

One tensors-only trace per preset gives every tensor's shape, dtype and logical axes; where a tensor lives
on a mesh is then the rules' answer for its logical axes without the size-1 axes (`physical_spec`), which
is pure Python. That is what lets `advise` check divisibility and bound memory for thousands of meshes in
seconds. The trace runs on one device with the candidates' batch, all mesh axes of size 1: shapes do not
depend on the mesh (the batch is per step, not per device), except inside an active pipeline, whose
microbatches change the activations' shapes (see `MeshTensors.activations_known`).

The template also keeps every logical-axes tuple its trace resolved, recorded on a tensor or not (the MoE
resolves the spec it places its expert weights on without naming it): with the tensors' own, they are all
the rules can reach in the program, which is what tells two presets that place everything alike
(`advise.programs`). Tensors-only plans have no place for them, so they are cached in an entry of their own.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shardscope.case.presets import get_preset
from shardscope.case.resolve import Case, get_model, resolve_case
from shardscope.case.rules import Rule, Spec, drop_unit_axes, indivisible_dims, resolve_logical
from shardscope.case.settings import MODEL_SETTABLE, apply_model_settings, check_model
from shardscope.case.topology import Topology, get_topology
from shardscope.golden.cache import case_key, load_cached, load_plan_text, store
from shardscope.plan.document import Plan
from shardscope.plan.json import plan_from_json, plan_to_json
from shardscope.plan.records import TENSORS_ONLY, CaseRecord, TensorRecord
from shardscope.stages.devices import configure_devices

# Bytes per element of the dtypes plans record.
_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "bfloat16": 2, "float16": 2, "int32": 4, "uint32": 4}
_ITEMSIZE |= {"float32": 4, "int64": 8, "uint64": 8, "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}
# A logical axis name (or None) per dimension.
LogicalAxes = tuple[str | None, ...]


def itemsize(dtype: str) -> int:
    """Bytes per element of a plan's dtype name."""
    if dtype in _ITEMSIZE:
        return _ITEMSIZE[dtype]
    # lazy: numpy loads on first use
    import ml_dtypes  # noqa: F401  (registers bfloat16 and the float8 types with numpy)
    import numpy as np

    return int(np.dtype(dtype).itemsize)


@dataclass(frozen=True)
class MeshTensors:
    """The template's tensors placed on one mesh: what a tensors-only plan of that mesh would record.

    `activations_known` is False under an active pipeline: the template's activations (one unsplit batch)
    are not that program's (microbatches), so they are left out — every figure here is then a lower bound.
    """

    tensors: tuple[tuple[str, TensorRecord], ...]
    specs: tuple[Spec, ...]  # of every template tensor but the outputs, whether placed here or not
    indivisible: tuple[str, ...]  # one line per tensor whose dimension its mesh axes do not divide
    activations_known: bool


@dataclass
class Template:
    """Every tensor of one model under one preset (from a tensors-only plan), ready to place on a mesh."""

    plan: Plan
    rules: tuple[Rule, ...]
    resolved: frozenset[LogicalAxes]  # every logical-axes tuple the trace resolved, recorded on a tensor or not
    _specs: dict[tuple[str | None, ...], Spec] = field(default_factory=dict)
    # Memoised per (tensor, sizes of the axes its rules name): a search places every tensor on thousands
    # of meshes, most of which agree on the few axes one tensor's rules use.
    _records: dict[tuple, tuple[Spec, TensorRecord, str]] = field(default_factory=dict)
    _placements: dict[tuple, MeshTensors] = field(default_factory=dict)
    _placeable: list[tuple[str, TensorRecord, tuple[str, ...]]] | None = None

    @property
    def logical_names(self) -> frozenset[str]:
        """Every logical axis name some tensor of the model carries."""
        return frozenset(name for _, t in self.plan.tensors if t.logical for name in t.logical if name is not None)

    def rule_spec(self, logical: Sequence[str | None]) -> Spec:
        """The rules' spec of a logical-axes tuple (before size-1 axes are dropped); memoised, as it does
        not depend on the mesh."""
        key = tuple(logical)
        if key not in self._specs:
            self._specs[key] = resolve_logical(key, self.rules)
        return self._specs[key]

    def place(self, mesh: Sequence[tuple[str, int]], pipelined: bool) -> MeshTensors:
        """The tensors on `mesh`. `pipelined`: the mesh runs the preset's pipeline (stage axis > 1).

        Memoised per mesh: a search screens a candidate, then predicts it, on the same placement."""
        key = (tuple(mesh), pipelined)
        found = self._placements.get(key)
        if found is None:
            found = self._placements[key] = self._place(dict(mesh), pipelined)
        return found

    def _place(self, sizes: dict[str, int], pipelined: bool) -> MeshTensors:
        placed: list[tuple[str, TensorRecord]] = []
        specs: list[Spec] = []
        bad: list[str] = []
        for entry in self._entries():
            path, tensor, rule_axes = entry
            # Everything below depends on the mesh only through the sizes of the axes the rules name.
            cache_key = (path, tuple(sizes.get(a, 1) for a in rule_axes))
            cached = self._records.get(cache_key)
            if cached is None:
                spec = self._spec(tensor, sizes)
                record, indivisible = _placed_record(path, tensor, spec, sizes)
                cached = self._records[cache_key] = (spec, record, indivisible)
            spec, record, indivisible = cached
            specs.append(spec)
            if tensor.kind == "activation" and pipelined:
                continue
            if indivisible:
                bad.append(indivisible)
            placed.append((path, record))
        return MeshTensors(tuple(placed), tuple(specs), tuple(bad), activations_known=not pipelined)

    def _entries(self) -> list[tuple[str, TensorRecord, tuple[str, ...]]]:
        """The placeable tensors (not outputs, not unnamed activations), each with the axes its rules name."""
        if self._placeable is None:
            self._placeable = [
                (path, tensor, _spec_axes(self.rule_spec(tensor.logical)) if tensor.logical is not None else ())
                for path, tensor in self.plan.tensors
                if tensor.kind != "output" and not (tensor.kind == "activation" and tensor.logical is None)
            ]
        return self._placeable

    def resolved_specs(self, mesh: Sequence[tuple[str, int]]) -> tuple[tuple[LogicalAxes, Spec], ...]:
        """Where the rules put each tuple the trace resolved, on `mesh` (size-1 axes dropped), in a fixed order."""
        sizes = dict(mesh)
        return tuple((axes, drop_unit_axes(self.rule_spec(axes), sizes)) for axes in sorted(self.resolved, key=repr))

    def _spec(self, tensor: TensorRecord, sizes: Mapping[str, int]) -> Spec:
        if tensor.logical is None:  # a state tensor without logical axes is replicated
            return (None,) * len(tensor.shape)
        spec = drop_unit_axes(self.rule_spec(tensor.logical), dict(sizes))
        return spec + (None,) * (len(tensor.shape) - len(spec))


def _placed_record(path: str, tensor: TensorRecord, spec: Spec, sizes: Mapping[str, int]) -> tuple[TensorRecord, str]:
    """The tensor placed by `spec`, and the first dimension its axes do not divide ("" when none)."""
    bad = [
        f"{path}: dimension {dim} of size {size} over {'×'.join(axes)} = {ways} shards"
        for dim, size, axes, ways in indivisible_dims(tensor.shape, spec, dict(sizes))[:1]
    ]
    return _record(tensor, spec, sizes), bad[0] if bad else ""


def _spec_axes(spec: Spec) -> tuple[str, ...]:
    """The mesh axes a spec names, in order."""
    return tuple(a for entry in spec if entry is not None for a in ((entry,) if isinstance(entry, str) else entry))


def _record(tensor: TensorRecord, spec: Spec, sizes: Mapping[str, int]) -> TensorRecord:
    local = []
    for size, entry in zip(tensor.shape, spec, strict=True):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        local.append(-(-size // math.prod(sizes[a] for a in axes)))
    nbytes = math.prod(local) * itemsize(tensor.dtype)
    return TensorRecord(tensor.kind, tensor.shape, tensor.dtype, tensor.logical, spec, tuple(local), nbytes)


def placed_plan(case: CaseRecord, placed: MeshTensors) -> Plan:
    """A tensors-only plan of the placed tensors, for the cost model's memory estimate."""
    return Plan(
        case=case,
        provenance=(("backend", "cpu"),),
        tensors=placed.tensors,
        parts=TENSORS_ONLY,
    )


def template_case(model: str, preset: str, topology: str, overrides: Mapping[str, str]) -> Case:
    """The case a preset's template is traced from: one device, every mesh axis 1, and the batch a step on
    `topology` has (made explicit: on one device a per-device batch would be another step).

    Raises:
      ShardscopeError: an unknown model, preset or topology, or a wrong setting (as `dump` would say).
    """

    devices = get_topology(topology).num_devices
    fields = {k.removeprefix("model."): v for k, v in overrides.items() if k.startswith("model.")}
    config = apply_model_settings(get_model(model), fields) if set(fields) <= set(MODEL_SETTABLE) else None
    settings = dict(overrides)
    if config is not None:
        check_model(model, config, devices)
        settings["model.global_batch"] = str(config.batch_for(devices))
    one = {axis: 1 for axis in get_preset(preset).mesh_axes}
    return resolve_case(model, preset, "cpu-1", one, settings)


def load_template(case: Case, pool: Topology, use_cache: bool = True) -> Template:
    """Traces the template case (a tensors-only plan and the tuples it resolved), or reads both from the plan
    cache (a plan cached without them, as `dump` caches one, is traced again).

    `pool` is the topology this process compiles for afterwards: fake CPU devices are sized once per
    process, so the pool is sized for it (not for the template's one device) before JAX starts.
    """

    rules = case.preset.logical_axis_rules
    key = case_key(case, tensors_only=True) if use_cache else None
    if key is not None:
        cached, resolved = load_plan_text(key), _load_resolved(_resolved_key(key))
        if cached is not None and resolved is not None:
            return Template(plan_from_json(cached, "cached template"), rules, resolved)
    plan, resolved = _trace_template(case, pool)
    if key is not None:
        store(key, plan_to_json(plan))
        store(_resolved_key(key), json.dumps(sorted((list(axes) for axes in resolved), key=repr)) + "\n")
    return Template(plan, rules, resolved)


def _trace_template(case: Case, pool: Topology) -> tuple[Plan, frozenset[LogicalAxes]]:
    """The tensors-only plan `dump` makes of the case (what `golden.pipeline.plan_case` makes, under the same
    cache key), and the tuples the trace resolved, which that plan does not keep."""
    import jax  # lazy: JAX loads only where a case is planned

    from shardscope.extract.plans import extract_tensors_plan
    from shardscope.lint.run import plan_findings, with_findings
    from shardscope.stages.compile import trace_case

    configure_devices(pool)
    jax.devices()  # starts the backend with that pool, so that nothing resizes it
    traced = trace_case(case)
    plan = extract_tensors_plan(traced)
    return with_findings(plan, plan_findings(case, plan, traced.resolved)), frozenset(traced.resolved)


def _resolved_key(key: str) -> str:
    """The cache entry of a template's resolved tuples, beside its plan's."""
    return hashlib.sha256(f"{key}:resolved".encode()).hexdigest()


def _load_resolved(key: str) -> frozenset[LogicalAxes] | None:
    """The cached resolved tuples, or None (never cached or unreadable: a miss, traced again)."""
    text = load_cached(key)
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    if not isinstance(data, list) or not all(isinstance(axes, list) for axes in data):
        return None
    return frozenset(tuple(axes) for axes in data)
