"""MaxText's sharding dumps (`tests/utils/sharding_info/<model>/<topology>/slice_N/<rule>/`) as plain records.

A dump directory holds three files that MaxText's `sharding_dump.py` writes:
- `named_shardings.json`: per train-state leaf, the mesh, physical spec and shape;
- `logical_shardings.json`: per leaf, the logical axes;
- `input_shardings.json`: the activation constraints traced with `debug_sharding` ("file/variable: dtype[shape]"
  → logical axes and physical spec, both as Python reprs; "Unknown: dtype[shape]" where MaxText could not name
  the variable, once per distinct type and spec).

Paths are normalised to shardscope's: `.params/['params']/['decoder']/…` → `params/decoder/…`,
`.opt_state/[0]/.mu/['params']/…` → `opt_state/0/mu/…` (the Flax `params` collection level is dropped).
Physical specs keep MaxText's own entries; `drop_unit_axes` gives the form plans use.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardscope.case.rules import Spec, drop_unit_axes, normalize_entry
from shardscope.errors import ShardscopeError
from shardscope.extract.state_paths import canonical_state_path
from shardscope.plan.document import Plan
from shardscope.plan.records import TENSORS_ONLY, CaseRecord, TensorRecord, tensor_record

DUMP_FILES = ("named_shardings.json", "logical_shardings.json", "input_shardings.json")
_KEY_PART = re.compile(r"\['([^']*)'\]|\[(\d+)\]|\.(\w+)")
# "file/variable: dtype[shape]", or "Unknown: dtype[shape]" where MaxText could not name the variable (the
# constraints of its Llama layer): read as file and name "Unknown".
# The shape is written as its type prints: with Explicit mesh axes a dimension carries its axes (`6@fsdp`,
# `64@(fsdp,expert)`).
_DIM = r"\d+(?:@(?:\w+|\([\w,]*\)))?"
_ACTIVATION_KEY = re.compile(
    rf"(?:(?P<file>[^/:]+)/)?(?P<name>[^:]+): (?P<dtype>\w+)\[(?P<shape>(?:{_DIM}(?:,{_DIM})*)?)\]"
)
_DIM_SIZE = re.compile(r"(\d+)(?:@(?:\w+|\([\w,]*\)))?")
UNNAMED = "Unknown"


@dataclass(frozen=True)
class DumpTensor:
    """One train-state leaf of a MaxText dump."""

    path: str
    shape: tuple[int, ...]
    logical: tuple[str | None, ...]
    spec: Spec


@dataclass(frozen=True)
class DumpActivation:
    """One activation constraint of a MaxText dump; `logical` is None where MaxText says "Unknown"."""

    module_file: str  # the source file that made the constraint ("attention_mla", "moe", ...)
    name: str  # the constrained variable's name there
    dtype: str
    shape: tuple[int, ...]
    logical: tuple[str | None, ...] | None
    spec: Spec


@dataclass(frozen=True)
class MaxTextDump:
    """A whole dump: the mesh (axis order kept), the train state's leaves and the activations."""

    mesh: tuple[tuple[str, int], ...]
    tensors: tuple[DumpTensor, ...]
    activations: tuple[DumpActivation, ...]


def normalize_path(key: str) -> str:
    """A MaxText train-state key as a plan path (see the module docstring)."""
    return canonical_state_path([m.group(1) or m.group(2) or m.group(3) for m in _KEY_PART.finditer(key)])


def _spec_entry(value: Any) -> str | tuple[str, ...] | None:
    if isinstance(value, (list, tuple)):
        return normalize_entry([str(v) for v in value])
    return normalize_entry(value)


def _parse_repr_tuple(text: str, where: str) -> tuple[Any, ...]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ShardscopeError(f"{where}: cannot read {text!r}") from None
    if not isinstance(value, tuple):
        value = (value,)
    return value


def _activation(key: str, entry: dict[str, Any], where: str) -> DumpActivation:
    match = _ACTIVATION_KEY.fullmatch(key)
    if match is None or not isinstance(entry, dict):
        raise ShardscopeError(f"{where}: unexpected activation entry {key!r}")
    raw_logical = entry.get("logic_axes", "Unknown")
    logical = None if raw_logical == "Unknown" else _parse_repr_tuple(raw_logical, where)
    pspec = str(entry.get("PartitionSpec", "P()"))
    spec = tuple(_spec_entry(e) for e in _parse_repr_tuple(pspec.removeprefix("P"), where))
    shape = tuple(int(size) for size in _DIM_SIZE.findall(match["shape"]))
    if match["file"] is None and match["name"] != UNNAMED:
        raise ShardscopeError(f"{where}: unexpected activation entry {key!r}")
    return DumpActivation(match["file"] or UNNAMED, match["name"], match["dtype"], shape, logical, spec)


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ShardscopeError(f"cannot read {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ShardscopeError(f"{path}: invalid JSON at line {err.lineno}: {err.msg}") from None


def read_dump(directory: Path) -> MaxTextDump:
    """Reads a MaxText sharding dump directory.

    Raises:
      ShardscopeError: a file is missing, unreadable, or not what MaxText writes.
    """
    missing = [name for name in DUMP_FILES if not (directory / name).is_file()]
    if missing:
        raise ShardscopeError(f"{directory}: not a MaxText sharding dump (missing {', '.join(missing)})")
    named, logical, inputs = (_load(directory / name) for name in DUMP_FILES)
    if not isinstance(named, dict) or not isinstance(logical, dict) or not isinstance(inputs, dict):
        raise ShardscopeError(f"{directory}: the dump files must each hold a JSON object")
    mesh: tuple[tuple[str, int], ...] = ()
    tensors = []
    try:
        for key, entry in named.items():
            if not mesh:
                shape = entry["mesh"]["shape"]
                mesh = tuple((str(axis), int(shape[axis])) for axis in entry["mesh"]["axis_names"])
            logical_axes = tuple(logical[key]["partition_spec"]) if key in logical else ()
            tensors.append(
                DumpTensor(
                    path=normalize_path(key),
                    shape=tuple(int(d) for d in entry["shape"]),
                    logical=logical_axes,
                    spec=tuple(_spec_entry(e) for e in entry["partition_spec"]),
                )
            )
    except (KeyError, TypeError, ValueError) as err:
        raise ShardscopeError(f"{directory / DUMP_FILES[0]}: unexpected entry ({type(err).__name__}: {err})") from None
    activations = read_activations(inputs.get("Activation Sharding Dump", []), str(directory / DUMP_FILES[2]))
    return MaxTextDump(mesh=mesh, tensors=tuple(tensors), activations=activations)


@dataclass(frozen=True)
class DumpCase:
    """What a dump directory's path says about its case (MaxText names it after the case)."""

    model: str
    topology: str
    slices: int
    rule: str  # "default" or a custom_mesh_and_rule name
    overrides: tuple[tuple[str, str], ...]  # MaxText config overrides, in the order given


_OVERRIDE = re.compile(r"([a-z][a-z0-9_]*)=([^_]+)")
_PARALLELISM = re.compile(r"ici_(\w+)_parallelism")


def parse_dump_path(directory: Path) -> DumpCase:
    """`…/<model>/<topology>/slice_<n>/rule_<rule>[_<key>=<value>…]` → DumpCase.

    Raises:
      ShardscopeError: the path is not laid out as MaxText lays out its dumps.
    """
    parts = directory.resolve().parts
    if len(parts) < 4 or not parts[-2].startswith("slice_") or not parts[-1].startswith("rule_"):
        raise ShardscopeError(
            f"{directory}: expected a MaxText dump directory <model>/<topology>/slice_<n>/rule_<rule>[_<overrides>]"
        )
    rule, _, rest = parts[-1].removeprefix("rule_").partition("_")
    return DumpCase(
        model=parts[-4],
        topology=parts[-3],
        slices=int(parts[-2].removeprefix("slice_")) if parts[-2].removeprefix("slice_").isdigit() else 1,
        rule=rule,
        overrides=tuple((m.group(1), m.group(2)) for m in _OVERRIDE.finditer(rest)),
    )


def equivalent_mesh_and_settings(case: DumpCase, mesh_axes: tuple[str, ...]) -> tuple[dict[str, int], dict[str, str]]:
    """The `--mesh` and `--set` values of the shardscope dump that plans the same case as a MaxText dump.

    MaxText sizes each mesh axis with `ici_<axis>_parallelism` (1 unless given; FSDP's default, -1, takes
    the remaining devices) and runs its ring-of-experts MoE with `use_ring_of_experts=true`.
    """
    mesh = {axis: 1 for axis in mesh_axes}
    if "fsdp" in mesh:
        mesh["fsdp"] = -1
    settings: dict[str, str] = {}
    for key, value in case.overrides:
        parallelism = _PARALLELISM.fullmatch(key)
        if parallelism and parallelism.group(1) in mesh:
            mesh[parallelism.group(1)] = int(value)
        elif key == "use_ring_of_experts" and value.lower() == "true":
            settings["moe"] = "ring"
    return mesh, settings


def state_record(
    path: str, shape: tuple[int, ...], dtype: Any, logical: tuple[str | None, ...], spec: Spec, sizes: dict[str, int]
) -> TensorRecord:
    """A train-state leaf of MaxText's as a plan record: a parameter or optimizer state, its spec without
    mesh axes of size 1 (as plans write them)."""
    kind = "param" if path.startswith("params/") else "opt_state"
    return tensor_record(kind, shape, dtype, logical, drop_unit_axes(spec, sizes), sizes)


def activation_records(activations: Sequence[DumpActivation], sizes: dict[str, int]) -> dict[str, TensorRecord]:
    """MaxText's activation constraints as plan records, `activations/<file>/<name>` (a name MaxText gives two
    different values is `…#2`, `…#3`)."""
    tensors: dict[str, TensorRecord] = {}
    for a in activations:
        base = f"activations/{a.module_file}/{a.name}"
        spec = drop_unit_axes(a.spec + (None,) * (len(a.shape) - len(a.spec)), sizes)  # P() may leave dims out
        record = tensor_record("activation", a.shape, a.dtype, a.logical, spec, sizes)
        path, suffix = base, 1
        while path in tensors and tensors[path] != record:
            suffix += 1
            path = f"{base}#{suffix}"
        tensors[path] = record
    return tensors


def read_activations(entries: Sequence[Any], where: str) -> tuple[DumpActivation, ...]:
    """MaxText's activation-sharding dump entries (`{"file/name: dtype[shape]": {...}}` each) as records.

    Raises:
      ShardscopeError: an entry not as MaxText writes them.
    """
    return tuple(
        _activation(key, value, where)
        for item in entries
        for key, value in (item.items() if isinstance(item, dict) else ())
    )


def dump_to_plan(directory: Path, model: str | None = None) -> Plan:
    """A MaxText dump as a tensors-only plan: its train state (parameters and optimizer state, float32 as
    MaxText's dump runs them) and its activations (`activations/<file>/<name>`), specs without mesh axes
    of size 1, as plans write them. The case comes from the directory's path; `model` names the model
    when the path does not (a dump copied out of MaxText's `<model>/<topology>/…` layout).

    Raises:
      ShardscopeError: the directory is not a readable MaxText dump.
    """
    dump = read_dump(directory)
    case = parse_dump_path(directory)
    sizes = dict(dump.mesh)
    tensors: dict[str, TensorRecord] = {}
    for t in dump.tensors:
        if t.path == "step":
            continue  # the train state's step counter: a scalar no sharding rule touches
        dtype = "int32" if t.path.endswith("/count") else "float32"
        tensors[t.path] = state_record(t.path, t.shape, dtype, t.logical, t.spec, sizes)
    tensors.update(activation_records(dump.activations, sizes))
    return Plan(
        case=CaseRecord(
            model=model or case.model,
            preset=case.rule,
            topology=case.topology if case.slices == 1 else f"{case.slices}x{case.topology}",
            mesh=dump.mesh,
            axis_types="auto",
            overrides=case.overrides,
        ),
        provenance=(("source", "maxtext sharding dump"), ("directory", str(directory))),
        tensors=tuple(sorted(tensors.items())),
        parts=TENSORS_ONLY,
    )
