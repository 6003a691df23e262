"""Presets: sharding rules as data (MaxText-compatible YAML), strict loading, and the built-in registry.

A preset file holds the keys of MaxText's `custom_mesh_and_rule` files (`mesh_axes`, `data_sharding`,
`logical_axis_rules`, `context_sharding`, `input_data_sharding_logical_axes`) plus shardscope's own
(`description`, `origin`, `mesh`, `moe`, `pipeline`, `shard_mode`, `shard_optimizer_over`). A MaxText rule file
loads unchanged; any
other key is an error, because a misspelt key silently ignored is a sharding change nobody reviewed.

Rules are read as MaxText reads them: a rule may name a mesh axis that `mesh_axes` lacks (MaxText's
`ep-as-dp.yml` names `context` and `tensor`); such an axis has size 1, so it shards nothing. Without a
`context_sharding` key, the context-parallel axis is MaxText's inference: the first mesh axis of the
first `activation_length` rule, else `context`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reference_models.config import PipelineSettings
from shardscope.case.preset_lint import LINT_KEYS, LintSettings, lint_ids, parse_bytes, parse_lint, preset_error
from shardscope.case.rules import Rule
from shardscope.errors import PresetError, ShardscopeError, unknown_name

PRESET_DIR = Path(__file__).parent / "builtin_presets"
MOE_STRATEGIES = ("all_to_all", "ring")
SHARD_MODES = ("auto", "explicit")
_KEYS = "mesh_axes data_sharding logical_axis_rules context_sharding input_data_sharding_logical_axes"
MAXTEXT_KEYS: tuple[str, ...] = tuple(_KEYS.split())
OWN_KEYS = ("description", "origin", "mesh", "moe", "pipeline", "shard_mode", "shard_optimizer_over", "lint")
PIPELINE_KEYS = ("stages_axis", "microbatches", "repeats", "fsdp_gather_once")
# A preset file's pipeline keys → the fields of the pipeline record.
_PIPELINE_FIELDS = {
    "stages_axis": "stage_axis",
    "microbatches": "microbatches",
    "repeats": "repeats",
    "fsdp_gather_once": "fsdp_gather_once",
}


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A named sharding configuration: mesh axes, default sizes, logical rules and strategies."""

    name: str
    description: str = ""
    origin: str = ""  # where the rules come from, for presets that carry another project's rule file
    source: str = ""  # the file path the user gave ("" for a built-in preset)
    mesh_axes: tuple[str, ...]
    mesh: tuple[tuple[str, int], ...] = ()  # default sizes; -1 fills the remaining devices
    data_sharding: tuple[tuple[str, ...], ...] = ()
    context_sharding: str | None = None
    input_data_sharding_logical_axes: tuple[str, ...] = (
        "activation_embed_and_logits_batch",
        "activation_norm_length",
    )
    logical_axis_rules: tuple[Rule, ...] = ()
    moe: str = "all_to_all"
    pipeline: PipelineSettings | None = None
    shard_mode: str = "auto"
    # ZeRO-1 (MaxText's shard_optimizer_over_data): the optimizer state, and the float32 parameters stored
    # with it, are split over this mesh axis as well; the step gathers the parameters back to their rules'
    # sharding before the forward pass (`shardscope.stages.state.zero1_spec`).
    shard_optimizer_over: str | None = None
    lint: LintSettings = dataclasses.field(default_factory=LintSettings)


def _as_axes(value: Any, source: str, where: str) -> tuple[str, ...]:
    """Mesh axes as written in YAML: a name, a list of names, [] or null."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise preset_error(source, f"{where} must be a mesh axis name or a list of them, found {value!r}")


def _parse_rules(value: Any, source: str) -> tuple[Rule, ...]:
    if not isinstance(value, list):
        raise preset_error(source, f"logical_axis_rules must be a list of [logical, mesh_axes] pairs, found {value!r}")
    rules = []
    for index, item in enumerate(value):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise preset_error(source, f"logical_axis_rules[{index}] must be [logical_name, mesh_axes], found {item!r}")
        where = f"logical_axis_rules[{index}] [{item[0]}, ...]"
        axes = _as_axes(item[1], source, where)
        _check_no_repeat(axes, source, where)
        rules.append((item[0], axes))
    return tuple(rules)


def _check_no_repeat(axes: tuple[str, ...], source: str, where: str) -> None:
    """A mesh axis can shard a dimension (or appear in a mesh) once."""
    repeated = sorted({axis for axis in axes if axes.count(axis) > 1})
    if repeated:
        raise preset_error(source, f"{where} names mesh axis {repeated[0]!r} more than once ({list(axes)})")


def _parse_mesh(value: Any, source: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        raise preset_error(source, f"mesh must map axis names to sizes (e.g. {{fsdp: -1, expert: 2}}), found {value!r}")
    return tuple((str(k), int(v)) for k, v in value.items())


def _parse_pipeline(value: Any, source: str) -> PipelineSettings | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise preset_error(source, f"pipeline must be a mapping with keys {', '.join(PIPELINE_KEYS)}, found {value!r}")
    unknown = sorted(set(value) - set(PIPELINE_KEYS))
    if unknown:
        raise preset_error(source, f"unknown pipeline key {unknown[0]!r} (known: {', '.join(PIPELINE_KEYS)})")
    settings = PipelineSettings(**{_PIPELINE_FIELDS[key]: item for key, item in value.items()})
    if not isinstance(settings.microbatches, int) or settings.microbatches < 1:
        raise preset_error(source, f"pipeline.microbatches must be a positive integer, found {settings.microbatches!r}")
    if not isinstance(settings.fsdp_gather_once, bool):
        found = settings.fsdp_gather_once
        raise preset_error(source, f"pipeline.fsdp_gather_once must be true or false, found {found!r}")
    return settings


def _choice(value: Any, allowed: tuple[str, ...], source: str, key: str) -> str:
    if value not in allowed:
        raise preset_error(source, f"{key} must be one of {', '.join(allowed)}, found {value!r}")
    return str(value)


def preset_from_mapping(data: Mapping[str, Any], name: str, source: str) -> Preset:
    """Validates a parsed preset mapping and builds the Preset.

    Args:
      data: the YAML document as a mapping.
      name: the preset's name (file stem for files).
      source: how to name it in errors (a path or a built-in name).

    Returns:
      The validated Preset.

    Raises:
      PresetError: an unknown key, a wrong type, or a rule naming a mesh axis the preset lacks.
    """
    known = MAXTEXT_KEYS + OWN_KEYS
    for key in data:
        if key not in known:
            raise preset_error(source, unknown_name("key", str(key), known).args[0])
    if "mesh_axes" not in data:
        raise preset_error(source, "missing required key 'mesh_axes' (e.g. mesh_axes: ['data', 'fsdp', 'expert'])")
    mesh_axes = _as_axes(data["mesh_axes"], source, "mesh_axes")
    if not mesh_axes:
        raise preset_error(source, "mesh_axes must name at least one axis")
    _check_no_repeat(mesh_axes, source, "mesh_axes")
    raw_sharding = data.get("data_sharding", [list(mesh_axes)])
    if not isinstance(raw_sharding, list):
        raise preset_error(source, f"data_sharding must be a list of axis lists, found {raw_sharding!r}")
    data_sharding = tuple(_as_axes(group, source, "data_sharding") for group in raw_sharding)
    rules = _parse_rules(data.get("logical_axis_rules", []), source)
    context = data.get("context_sharding", _inferred_context_axis(rules, mesh_axes))
    if context is not None and not isinstance(context, str):
        raise preset_error(source, f"context_sharding must be one mesh axis name, found {context!r}")
    preset = Preset(
        name=name,
        description=str(data.get("description", "")).strip(),
        origin=str(data.get("origin", "")).strip(),
        mesh_axes=mesh_axes,
        mesh=_parse_mesh(data.get("mesh", {}), source),
        data_sharding=data_sharding,
        context_sharding=context,
        input_data_sharding_logical_axes=_as_axes(
            data.get("input_data_sharding_logical_axes", list(Preset.input_data_sharding_logical_axes)),
            source,
            "input_data_sharding_logical_axes",
        ),
        logical_axis_rules=rules,
        moe=_choice(data.get("moe", "all_to_all"), MOE_STRATEGIES, source, "moe"),
        pipeline=_parse_pipeline(data.get("pipeline"), source),
        shard_mode=_choice(data.get("shard_mode", "auto"), SHARD_MODES, source, "shard_mode"),
        shard_optimizer_over=_optional_axis(data.get("shard_optimizer_over"), source, "shard_optimizer_over"),
        lint=parse_lint(data.get("lint"), source),
    )
    _check_axes_exist(preset, source)
    return preset


def _optional_axis(value: Any, source: str, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise preset_error(source, f"{where} must be one mesh axis name, found {value!r}")
    return value


def _inferred_context_axis(rules: tuple[Rule, ...], mesh_axes: tuple[str, ...]) -> str | None:
    """MaxText's context-parallel axis when a file does not name one: the first mesh axis of the first
    `activation_length` rule, else `context`; None when the mesh lacks it."""
    for logical, axes in rules:
        if logical == "activation_length":
            if axes:
                return axes[0] if axes[0] in mesh_axes else None
            break
    return "context" if "context" in mesh_axes else None


def absent_rule_axes(preset: Preset) -> tuple[str, ...]:
    """Mesh axes the rules or data_sharding name but `mesh_axes` lacks: size 1, as MaxText treats them."""
    named = [axis for _, axes in preset.logical_axis_rules for axis in axes]
    named += [axis for group in preset.data_sharding for axis in group]
    return tuple(sorted({axis for axis in named if axis not in preset.mesh_axes}))


# Every mesh axis MaxText has had: base.yml's `mesh_axes`, and `tensor_transpose` of its older rule files. A
# rule may name one its file's mesh lacks (MaxText's shared files do: size 1); any other name is a typo when
# it is close to an axis of the mesh.
MAXTEXT_MESH_AXES = frozenset(
    {"diloco", "data", "stage", "fsdp", "fsdp_transpose", "context", "context_usp_ulysses"}
    | {"context_autoregressive", "tensor", "tensor_transpose", "tensor_sequence", "expert", "autoregressive"}
)


def _check_axes_exist(preset: Preset, source: str) -> None:
    """Mesh sizes, the context axis and the pipeline's stage axis must name axes of `mesh_axes`; rules and
    data_sharding may name others (size 1), unless the name is a misspelling of one of the mesh's."""
    for logical, axes in preset.logical_axis_rules:
        for axis in axes:
            if axis in preset.mesh_axes or axis in MAXTEXT_MESH_AXES:
                continue
            close = difflib.get_close_matches(axis, preset.mesh_axes, n=1, cutoff=0.8)
            if close:
                raise preset_error(
                    source,
                    f"rule {logical} → {axis} names mesh axis {axis!r}, which mesh_axes lacks; "
                    f"did you mean {close[0]!r}?",
                )
    mentioned: list[tuple[str, str]] = [(axis, "mesh") for axis, _ in preset.mesh]
    if preset.context_sharding:
        mentioned.append((preset.context_sharding, "context_sharding"))
    if preset.pipeline:
        mentioned.append((preset.pipeline.stage_axis, "pipeline.stages_axis"))
    if preset.shard_optimizer_over:
        mentioned.append((preset.shard_optimizer_over, "shard_optimizer_over"))
    for axis, where in mentioned:
        if axis not in preset.mesh_axes:
            hint = unknown_name("mesh axis", axis, preset.mesh_axes).args[0]
            raise preset_error(source, f"{where} names a missing mesh axis: {hint}")


def load_preset_file(path: str | Path, name: str | None = None) -> Preset:
    """Loads a preset YAML file (MaxText `custom_mesh_and_rule` files included) strictly."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise preset_error(source, f"cannot read file ({err.strerror})") from None
    return _preset_from_text(text, name or path.stem, source)


@functools.lru_cache(maxsize=64)
def _preset_from_text(text: str, name: str, source: str) -> Preset:
    """Parses and validates a preset (cached by its text: a check resolves every case's preset twice)."""
    try:
        # libyaml's loader when PyYAML has it: MaxText's base rules take ~40 ms to parse in pure Python.
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise preset_error(source, f"malformed YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise preset_error(source, f"expected a YAML mapping of preset keys, found {type(data).__name__}")
    return preset_from_mapping(data, name, source)


@functools.cache
def builtin_preset_names() -> tuple[str, ...]:
    """Names of the presets shipped with shardscope."""
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))


# A built-in preset, read once per process: the package's files do not change under it (a search resolves one
# per candidate).
_builtin_preset = functools.cache(lambda name: load_preset_file(PRESET_DIR / f"{name}.yaml"))


def _source_name(path: Path) -> str:
    """A preset file as plans name it: relative to the working directory when below it (so a plan made in a
    checkout names it alike in every checkout), else by its file name."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.name


def get_preset(name_or_path: str) -> Preset:
    """A built-in preset by name, or a preset file by path.

    Raises:
      UnknownNameError: neither a built-in name nor an existing file (with a "did you mean").
      PresetError: the file is malformed.
    """
    if name_or_path in builtin_preset_names():
        return _builtin_preset(name_or_path)
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise PresetError(f"preset file {name_or_path} does not exist")
        return dataclasses.replace(load_preset_file(path), source=_source_name(path))
    raise unknown_name("preset", name_or_path, builtin_preset_names())


PRESET_SETTABLE = (
    "moe",
    "shard_mode",
    "context_sharding",
    "shard_optimizer_over",
    *(f"pipeline.{k}" for k in PIPELINE_KEYS),
    *(f"lint.{k}" for k in LINT_KEYS),
)


def apply_preset_overrides(preset: Preset, overrides: Mapping[str, str]) -> Preset:
    """Applies `--set key=value` overrides that address the preset (moe, shard_mode, shard_optimizer_over,
    pipeline.*)."""
    for key, value in overrides.items():
        if key in ("moe", "shard_mode"):
            allowed = MOE_STRATEGIES if key == "moe" else SHARD_MODES
            changes: dict[str, Any] = {key: _choice(value, allowed, preset.name, key)}
            preset = dataclasses.replace(preset, **changes)
        elif key == "context_sharding":
            preset = dataclasses.replace(preset, context_sharding=value or None)
        elif key == "shard_optimizer_over":
            preset = dataclasses.replace(preset, shard_optimizer_over=value or None)
        elif key.startswith("pipeline."):
            field = key.removeprefix("pipeline.")
            if field not in PIPELINE_KEYS:
                raise unknown_name("setting", key, PRESET_SETTABLE)
            current = preset.pipeline or PipelineSettings()
            typed: Any = value
            if field == "fsdp_gather_once":
                typed = _boolean(key, value)
            elif field != "stages_axis":
                typed = _positive_int(key, value)
            changed = dataclasses.replace(current, **{_PIPELINE_FIELDS[field]: typed})
            preset = dataclasses.replace(preset, pipeline=changed)
        elif key == "lint.ignore":
            # Added to what the preset silences: `--set` widens a file's choice, it does not undo it.
            ignore = lint_ids(value, preset.name, f"--set {key}")
            preset = dataclasses.replace(
                preset, lint=dataclasses.replace(preset.lint, ignore=tuple(dict.fromkeys(preset.lint.ignore + ignore)))
            )
        elif key == "lint.max_replicated_bytes":
            limit = parse_bytes(value, f"--set {key}={value}")
            preset = dataclasses.replace(preset, lint=dataclasses.replace(preset.lint, max_replicated_bytes=limit))
        else:
            raise unknown_name("setting", key, PRESET_SETTABLE)
    _check_axes_exist(preset, preset.name)
    return preset


def with_model_rules(preset: Preset, model_rules: tuple[Rule, ...]) -> Preset:
    """The preset with a model's own rules (MaxText's model yml `logical_axis_rules`), merged as MaxText merges
    them into base.yml's: each replaces the rules of its logical name and goes last. Only MaxText's defaults
    (`default`) take them: any other preset is a `custom_mesh_and_rule` file, whose rules replace them all."""
    if not model_rules or preset.name != "default":
        return preset
    names = {logical for logical, _ in model_rules}
    kept = tuple(rule for rule in preset.logical_axis_rules if rule[0] not in names)
    return dataclasses.replace(preset, logical_axis_rules=kept + tuple(model_rules))


# MaxText's rule for the batch of the embedding, logits and loss when it pipelines (configs/types.py).
_PIPELINED_LOGITS_BATCH = ("stage", "data", "fsdp", "fsdp_transpose", "expert")


def as_maxtext_pipelines(
    preset: Preset, sizes: tuple[tuple[str, int], ...]
) -> tuple[Preset, tuple[tuple[str, int], ...]]:
    """The preset and mesh as MaxText's config rewrites them when the stage axis is in use ("for AOT
    compilation and correctness, always prioritize the 'stage' axis"): the stage axis moves before `data` in
    the mesh and first in `data_sharding`, and `activation_embed_and_logits_batch` shards over stage, data,
    fsdp, fsdp_transpose and expert (those of them the mesh has). Unchanged without a pipeline."""
    stage = preset.pipeline.stage_axis if preset.pipeline is not None else ""
    if dict(sizes).get(stage, 1) <= 1:
        return preset, sizes
    axes = list(preset.mesh_axes)
    if "data" in axes and axes.index(stage) > axes.index("data"):
        first, second = axes.index("data"), axes.index(stage)
        axes[first], axes[second] = stage, "data"
    named = (stage if axis == "stage" else axis for axis in _PIPELINED_LOGITS_BATCH)
    batch = tuple(axis for axis in named if axis in axes)
    rules = list(preset.logical_axis_rules)
    for index, (name, _) in enumerate(rules):
        if name == "activation_embed_and_logits_batch":
            rules[index] = (name, batch)
            break
    data_sharding = list(preset.data_sharding)
    if data_sharding and stage in data_sharding[0]:
        data_sharding[0] = (stage, *(a for a in data_sharding[0] if a != stage))
    moved = dataclasses.replace(
        preset, mesh_axes=tuple(axes), logical_axis_rules=tuple(rules), data_sharding=tuple(data_sharding)
    )
    by_axis = dict(sizes)
    return moved, tuple((axis, by_axis[axis]) for axis in axes)


def stage_as_data(
    rules: tuple[tuple[str, tuple[str, ...]], ...], stage: str
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The rules for layers a pipeline does not run, as MaxText's `logical_axis_rules_pp_act_as_dp` makes
    them: the stage axis acts as data (taken out of every rule, and put before `data` where a rule has it)."""
    moved = []
    for name, axes in rules:
        kept = tuple(axis for axis in axes if axis != stage)
        if "data" in kept:
            at = kept.index("data")
            kept = (*kept[:at], stage, *kept[at:])
        moved.append((name, kept))
    return tuple(moved)


def _boolean(key: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ShardscopeError(f"--set {key}={value}: expected true or false")
    return value.lower() == "true"


def _positive_int(key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ShardscopeError(f"--set {key}={value}: expected a positive integer")
    return number
